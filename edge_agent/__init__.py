"""haarvest.edge_agent"""
