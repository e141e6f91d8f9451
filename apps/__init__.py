"""malleparsl.apps"""
