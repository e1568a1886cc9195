package dev.lakesink.udf;

import org.apache.spark.sql.api.java.UDF1;

/**
 * The number of ':' bytes in a record's value: a byte loop, no string or array is built.
 *
 * <p>lakesink's JSON decoder uses it to skip the exact unknown-key check (a second JSON
 * parse) for records that cannot have a key outside the schema: every key of a JSON object
 * is followed by a colon, so a record with no more colons than the fields it filled has
 * no other key. Registered as {@code lakesink_count_colons} by
 * {@code lakesink.runtime.spark.register_jvm_functions}; without this jar the decoder counts
 * with Spark's {@code split}, which gives the same answer at a higher cost.
 */
public final class CountColons implements UDF1<byte[], Integer> {
  private static final long serialVersionUID = 1L;

  @Override
  public Integer call(byte[] value) {
    if (value == null) {
      return null;
    }
    int n = 0;
    for (byte b : value) {
      if (b == ':') {
        n++;
      }
    }
    return n;
  }
}
