"""malleparsl.scavenger"""
