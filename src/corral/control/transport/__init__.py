"""control/transport"""
