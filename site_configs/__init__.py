"""malleparsl.site_configs"""
