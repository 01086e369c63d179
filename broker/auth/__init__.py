"""Authentication: who is calling, and which tenant they act for."""
