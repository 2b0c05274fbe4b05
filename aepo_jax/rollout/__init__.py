"""Rollout strategies (spec section 2): independent sampling, ARPO and AEPO trees."""
