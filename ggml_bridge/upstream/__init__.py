"""Upstream llama.cpp: the pin, fetching its trees, applying the series, moving the series onto another upstream and the radar over every newer build."""
