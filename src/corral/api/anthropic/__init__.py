"""api/anthropic"""
