"""malleparsl.jpa"""
