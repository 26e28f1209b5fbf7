# The control channel of the spike, both ways. Not ember's schema: a stand-in with the shape
# issue 13 asks for (load a table in chunks, drop one, report a status).
@0xd4c1e3a9b07f2c11;

# (a) Cap'n Proto RPC over a Unix stream socket.
interface Control {
  loadTable @0 (fileId :UInt64, chunk :UInt32, chunks :UInt32, rows :Data) -> ();
  dropTable @1 (fileId :UInt64) -> ();
  status @2 () -> (status :Status);
}

# (b) Plain messages over SOCK_SEQPACKET: one request per datagram, one reply per request.
struct Request {
  id @0 :UInt64;
  union {
    loadTable @1 :LoadTable;
    dropTable @2 :UInt64;
    status @3 :Void;
  }
}

struct LoadTable {
  fileId @0 :UInt64;
  chunk @1 :UInt32;
  chunks @2 :UInt32;
  rows @3 :Data;
}

struct Reply {
  id @0 :UInt64;
  union {
    ok @1 :Void;
    refused @2 :Text;
    status @3 :Status;
  }
}

struct Status {
  tablesLoaded @0 :UInt64;
  rowsLoaded @1 :UInt64;
  refused @2 :UInt64;
  pendingBytes @3 :UInt64;
  vmHwmKib @4 :UInt64;
}
