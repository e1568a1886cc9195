"""Runtime: the Spark session, JVM jars, local services and shutdown handling."""
