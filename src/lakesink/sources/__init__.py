"""Sources: Kafka (Spark's built-in connector); Redis and Danube come later."""
