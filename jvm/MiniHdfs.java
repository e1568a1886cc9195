// A real single-node HDFS for lakesink's tests: MiniDFSCluster (hadoop-client-minicluster).
// Run as a single-file program: java -cp 'jvm/hdfs-jars/*' jvm/MiniHdfs.java <dir> <nn-port>
// Prints "READY <hdfs uri> <webhdfs http address>" when up; stops when stdin closes.
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;

public class MiniHdfs {
    public static void main(String[] args) throws Exception {
        Configuration conf = new Configuration();
        conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, args[0]);
        conf.set("dfs.permissions.enabled", "false");
        conf.set("dfs.namenode.http-address", "127.0.0.1:0");
        conf.set("dfs.datanode.address", "127.0.0.1:0");
        conf.set("dfs.datanode.http.address", "127.0.0.1:0");
        conf.set("dfs.datanode.ipc.address", "127.0.0.1:0");
        conf.set("dfs.replication", "1");
        MiniDFSCluster cluster = new MiniDFSCluster.Builder(conf)
            .nameNodePort(Integer.parseInt(args[1])).numDataNodes(1).format(true).build();
        cluster.waitActive();
        System.out.println("READY " + cluster.getURI() + " "
            + cluster.getNameNode().getHttpAddress().getHostString() + ":"
            + cluster.getNameNode().getHttpAddress().getPort());
        System.out.flush();
        while (System.in.read() != -1) { }
        cluster.shutdown();
    }
}
