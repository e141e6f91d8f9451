"""malleparsl.workflows"""
