"""malleparsl.sim"""
