"""malleparsl.executors"""
