"""api/core"""
