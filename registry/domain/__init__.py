"""What the registry is made of, besides its tables (registry/models.py): choices, traffic-split rules, roles."""
