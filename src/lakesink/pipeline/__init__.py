"""The data path between source and table: decode, partition columns, the batch function."""
