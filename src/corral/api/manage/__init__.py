"""api/manage"""
