package dev.lakesink.udf;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import org.apache.spark.sql.api.java.UDF1;

/**
 * The number of ':' bytes in a record's value, eight bytes at a time; no string or array
 * is built.
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
  private static final VarHandle LONGS =
      MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
  private static final long COLONS = 0x3A3A3A3A3A3A3A3AL;
  private static final long LOW7 = 0x7F7F7F7F7F7F7F7FL;

  @Override
  public Integer call(byte[] value) {
    if (value == null) {
      return null;
    }
    int n = 0;
    int i = 0;
    for (; i + 8 <= value.length; i += 8) {
      // a byte of x is zero exactly where the word has a colon; the high bit of each
      // byte of t is set exactly for the zero bytes of x (no carries between bytes)
      long x = (long) LONGS.get(value, i) ^ COLONS;
      long t = ~(((x & LOW7) + LOW7) | x | LOW7);
      n += Long.bitCount(t);
    }
    for (; i < value.length; i++) {
      if (value[i] == ':') {
        n++;
      }
    }
    return n;
  }
}
