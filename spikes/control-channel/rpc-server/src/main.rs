//! (a) Cap'n Proto RPC over a Unix stream socket, sampler side: a `Control` capability served by
//! capnp-rpc's two-party VatNetwork on a single-threaded tokio runtime (capnp-rpc is !Send, so a
//! LocalSet). Calls are handled on the one thread; capnp-rpc reads incoming calls as they come and
//! runs each call's future. Usage: spike-rpc-server PATH [DELAY_US]
use std::{cell::RefCell, rc::Rc};

use capnp::{capability::Rc as CapRc, message::ReaderOptions};
use capnp_rpc::{rpc_twoparty_capnp::Side, twoparty::VatNetwork, RpcSystem};
use futures::AsyncReadExt;
use spike_common::{
    control_capnp::control,
    tables::{vm_hwm_kib, Tables},
};
use tokio_util::compat::TokioAsyncReadCompatExt;

struct Control {
    tables: Rc<RefCell<Tables>>,
}

impl control::Server for Control {
    async fn load_table(
        self: CapRc<Self>,
        params: control::LoadTableParams,
        _: control::LoadTableResults,
    ) -> Result<(), capnp::Error> {
        let p = params.get()?;
        let rows = p.get_rows()?;
        self.tables
            .borrow_mut()
            .load_chunk(p.get_file_id(), p.get_chunk(), p.get_chunks(), rows)
            .map_err(capnp::Error::failed)
    }

    async fn drop_table(
        self: CapRc<Self>,
        params: control::DropTableParams,
        _: control::DropTableResults,
    ) -> Result<(), capnp::Error> {
        self.tables.borrow_mut().drop_table(params.get()?.get_file_id());
        Ok(())
    }

    async fn status(
        self: CapRc<Self>,
        _: control::StatusParams,
        mut results: control::StatusResults,
    ) -> Result<(), capnp::Error> {
        let t = self.tables.borrow();
        let mut s = results.get().init_status();
        s.set_tables_loaded(t.tables_loaded);
        s.set_rows_loaded(t.rows_loaded);
        s.set_refused(t.refused);
        s.set_pending_bytes(t.pending_bytes());
        s.set_vm_hwm_kib(vm_hwm_kib());
        Ok(())
    }
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "/tmp/spike-rpc.sock".into());
    let delay_us = args.next().and_then(|d| d.parse().ok()).unwrap_or(0);
    let tables = Rc::new(RefCell::new(Tables::new(delay_us)));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path)?;
        eprintln!("rpc-server: listening on {path}");
        loop {
            let (stream, _) = listener.accept().await?;
            let (reader, writer) = stream.compat().split();
            // The same per-message bound as the datagram server: 64 KiB of words per message.
            let options = *ReaderOptions::new().traversal_limit_in_words(Some(64 * 1024 / 8)).nesting_limit(8);
            let network = VatNetwork::new(reader, writer, Side::Server, options);
            let client: control::Client = capnp_rpc::new_client(Control { tables: tables.clone() });
            let rpc = RpcSystem::new(Box::new(network), Some(client.client));
            // One relay at a time, like the sampler: serve it until it disconnects.
            // A malformed or oversized message ends the whole connection (counted as one refusal).
            if let Err(e) = rpc.await {
                eprintln!("rpc-server: connection ended: {e}");
                tables.borrow_mut().refused += 1;
            }
            tables.borrow_mut().disconnected();
        }
    })
}

