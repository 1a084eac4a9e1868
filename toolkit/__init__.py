"""runifold toolkit."""
