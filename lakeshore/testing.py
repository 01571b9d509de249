"""Lakeshore pytest plugin (placeholder)."""
