"""Decoders: raw record bytes -> typed columns, plus a reject reason per record."""
