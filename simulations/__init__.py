"""haarvest.simulations"""
