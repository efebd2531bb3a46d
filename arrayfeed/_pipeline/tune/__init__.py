"""Tuning: how many reader threads and loader processes read, and what this process may use."""
