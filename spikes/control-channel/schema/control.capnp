# The control channel of the spike. Not ember's schema: a stand-in with the shape the control
# channel needs (load a table in chunks, drop one, report a status). The capnp-rpc `interface Control` it was
# measured against is in commit 94ba1f4, with its server.
@0xd4c1e3a9b07f2c11;

# Plain messages over SOCK_SEQPACKET: one request per datagram, one reply per request.
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
