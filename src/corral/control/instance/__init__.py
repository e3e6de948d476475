"""control/instance"""
