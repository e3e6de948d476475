"""api/page"""
