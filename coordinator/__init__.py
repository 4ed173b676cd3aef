"""haarvest.coordinator"""
