//! The thin safe layer over the C shim (`csrc/shim.c`): one [`Endpoint`]
//! owns a libfabric RDM endpoint, its completion queue, address vector and
//! the registration of the member's region.
//!
//! # Invariants
//! - An `Endpoint` is used by one thread at a time (`&mut self` on every
//!   call; the fabric keeps it behind a mutex), matching the
//!   `FI_THREAD_DOMAIN` model the shim asks for.
//! - The registered memory (the [`Region`]) outlives the registration: the
//!   endpoint holds a clone of the region and closes libfabric before
//!   dropping it.
//! - Every write lies inside the region: callers check ranges first and
//!   this layer asserts it again before handing pointers to C.

use ordo_fabric::Region;
use std::ffi::{CStr, CString, c_char, c_int, c_void};

#[repr(C)]
struct RawAttr {
    tx_msg_order: u64,
    max_order_waw_size: u64,
    max_msg_size: u64,
    inject_size: u64,
    tx_size: u64,
    mr_mode: u64,
    data_progress_manual: u64,
    key: u64,
    cq_data_size: u64,
    prov_name: [c_char; 64],
    fabric_name: [c_char; 64],
}

/// One completion read from the queue.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Completion {
    /// The context the write was posted with.
    pub context: u64,
    /// 0, or the positive libfabric error code of a failed write.
    pub err: i32,
    /// The provider's own error number (diagnostics only).
    pub prov_errno: i32,
    /// Non-zero: not a completion of ours but a peer's write carrying
    /// remote CQ data that landed in this member's region.
    pub remote: u64,
    /// The remote CQ data (the writer's member id).
    pub data: u64,
}

#[repr(C)]
struct RawOfi {
    _private: [u8; 0],
}

unsafe extern "C" {
    fn ordo_ofi_open(
        prov: *const c_char,
        msg: c_int,
        node: *const c_char,
        base: *mut c_void,
        len: usize,
        sbase: *mut c_void,
        slen: usize,
        requested_key: u64,
        out: *mut *mut RawOfi,
        attr: *mut RawAttr,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    fn ordo_ofi_close(o: *mut RawOfi);
    fn ordo_ofi_name(o: *mut RawOfi, addr: *mut c_void, len: *mut usize) -> c_int;
    fn ordo_ofi_av_insert(o: *mut RawOfi, addr: *const c_void, fi_addr: *mut u64) -> c_int;
    fn ordo_ofi_av_remove(o: *mut RawOfi, fi_addr: u64) -> c_int;
    fn ordo_ofi_write(
        o: *mut RawOfi,
        via: i64,
        staged: i64,
        offset: usize,
        len: usize,
        dest: u64,
        remote_addr: u64,
        key: u64,
        context: u64,
        flags: u64,
        data: u64,
    ) -> isize;
    fn ordo_ofi_poll(o: *mut RawOfi, out: *mut Completion, count: usize) -> isize;
    fn ordo_ofi_strerror(err: c_int) -> *const c_char;
    fn ordo_ofi_flag_completion() -> u64;
    fn ordo_ofi_flag_delivery_complete() -> u64;
    fn ordo_ofi_flag_remote_cq_data() -> u64;
    fn ordo_ofi_order_waw() -> u64;
    fn ordo_ofi_mr_virt_addr() -> u64;
    fn ordo_ofi_eagain() -> c_int;
    fn ordo_ofi_max_eps() -> usize;
    fn ordo_ofi_wait_fd(o: *mut RawOfi) -> c_int;
    fn ordo_ofi_trywait(o: *mut RawOfi) -> c_int;
    fn ordo_ofi_msg_connect(
        o: *mut RawOfi,
        slot: usize,
        addr: *const c_void,
        addrlen: usize,
        param: *const c_void,
        paramlen: usize,
    ) -> c_int;
    fn ordo_ofi_msg_event(o: *mut RawOfi, out: *mut RawCm) -> c_int;
    fn ordo_ofi_msg_accept(o: *mut RawOfi, request: *mut c_void, slot: usize) -> c_int;
    fn ordo_ofi_msg_reject(o: *mut RawOfi, request: *mut c_void);
    fn ordo_ofi_msg_close(o: *mut RawOfi, slot: usize);
    fn ordo_ofi_rdm_send_ep(o: *mut RawOfi, slot: usize) -> c_int;
}

#[repr(C)]
struct RawCm {
    kind: i32,
    err: i32,
    slot: u64,
    request: *mut c_void,
    param_len: u32,
    param: [u8; 64],
}

/// Which kind of endpoint a member opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum EndpointType {
    /// Reliable datagrams (`FI_EP_RDM`): one endpoint, peers in an address
    /// vector (`verbs;ofi_rxm`, `tcp;ofi_rxm`, `tcp`, `shm`).
    #[default]
    Rdm,
    /// Connected endpoints (`FI_EP_MSG`): a passive endpoint peers connect
    /// to and one endpoint per connection (`verbs`, `tcp`) — RDMA's
    /// reliable connections, what Derecho uses.
    Msg,
}

/// A connection event of a connected (`FI_EP_MSG`) endpoint.
#[derive(Debug)]
pub enum CmEvent {
    /// A peer asks to connect, with its private data; answer with
    /// [`Endpoint::accept`] or [`Endpoint::reject`] at once.
    Request {
        /// The pending request (owned by libfabric until answered).
        request: Request,
        /// The request's private data.
        param: Vec<u8>,
    },
    /// The connection in `slot` is up.
    Connected {
        /// Its slot.
        slot: usize,
    },
    /// The connection in `slot` was shut down by the peer.
    Shutdown {
        /// Its slot.
        slot: usize,
    },
    /// The connection in `slot` (None: the listener) failed.
    Error {
        /// Its slot, if the event names one.
        slot: Option<usize>,
        /// libfabric's error code.
        err: i32,
    },
}

/// A connection request awaiting an answer.
#[derive(Debug)]
pub struct Request(*mut c_void);

/// libfabric's message for an error code (either sign).
pub fn strerror(err: i64) -> String {
    // SAFETY: fi_strerror returns a static NUL-terminated string for any code.
    unsafe { CStr::from_ptr(ordo_ofi_strerror(err as c_int)) }.to_string_lossy().into_owned()
}

/// A libfabric call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("libfabric: {0}")]
pub struct OfiError(pub String);

/// What the provider promised (from its `fi_info`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderAttr {
    /// The provider, e.g. `tcp;ofi_rxm` or `shm`.
    pub provider: String,
    /// The fabric's name (e.g. a subnet).
    pub fabric: String,
    /// Whether writes to one peer land in posting order (`FI_ORDER_WAW` or
    /// `FI_ORDER_RMA_WAW`), and up to which size.
    pub write_after_write: Option<u64>,
    /// Largest single write.
    pub max_msg_size: u64,
    /// Transmit queue depth.
    pub tx_size: u64,
    /// Whether remote addresses are virtual addresses (`FI_MR_VIRT_ADDR`)
    /// rather than offsets into the registration.
    pub virt_addr: bool,
    /// Whether data moves only when the application polls.
    pub manual_progress: bool,
    /// The memory registration's key (requested, or the provider's).
    pub key: u64,
    /// Bytes of remote CQ data a write may carry (0: none, so no
    /// doorbell).
    pub cq_data_size: u64,
}

/// Flags a write may carry.
#[derive(Clone, Copy, Debug)]
pub struct WriteFlags {
    /// Report a completion (`FI_COMPLETION`).
    pub completion: bool,
    /// Report it only once the data is visible at the peer
    /// (`FI_DELIVERY_COMPLETE`).
    pub delivery: bool,
    /// Carry remote CQ data (`FI_REMOTE_CQ_DATA`): the peer's completion
    /// queue reports the write's arrival (its doorbell rings).
    pub ring: Option<u64>,
}

/// An open RDM endpoint with the member's region registered.
pub struct Endpoint {
    raw: *mut RawOfi,
    kind: EndpointType,
    staging: Region,
    region: Region,
    attr: ProviderAttr,
    flag_completion: u64,
    flag_delivery: u64,
    flag_remote_cq_data: u64,
    eagain: i64,
}

// SAFETY: the handle is only used through `&mut self` (one thread at a
// time); libfabric objects opened with FI_THREAD_DOMAIN may move between
// threads as long as calls are serialised.
unsafe impl Send for Endpoint {}

/// The outcome of posting one write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Posted {
    /// Queued with the provider.
    Yes,
    /// The transmit queue is full: poll and retry.
    Again,
}

impl Endpoint {
    /// Opens an endpoint of `kind` on `provider` and registers `region` with
    /// `requested_key`. `node`: the local address to bind (connected
    /// endpoints listen there), or any.
    pub fn open(
        provider: &str,
        kind: EndpointType,
        node: Option<&str>,
        region: Region,
        staging: Region,
        requested_key: u64,
    ) -> Result<Endpoint, OfiError> {
        let prov = CString::new(provider).map_err(|_| OfiError(format!("bad provider name {provider:?}")))?;
        let node = CString::new(node.unwrap_or("")).map_err(|_| OfiError("bad node name".into()))?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: an all-zero RawAttr is valid (integers and byte arrays).
        let mut a: RawAttr = unsafe { std::mem::zeroed() };
        let mut err = [0 as c_char; 256];
        // SAFETY: all pointers are valid for the call; the region's memory
        // stays mapped for as long as the endpoint (which holds the region).
        let ret = unsafe {
            ordo_ofi_open(
                prov.as_ptr(),
                c_int::from(kind == EndpointType::Msg),
                node.as_ptr(),
                region.as_ptr().cast(),
                region.len(),
                staging.as_ptr().cast(),
                staging.len(),
                requested_key,
                &mut raw,
                &mut a,
                err.as_mut_ptr(),
                err.len(),
            )
        };
        if ret != 0 || raw.is_null() {
            // SAFETY: the shim NUL-terminates the message within the buffer.
            let msg = unsafe { CStr::from_ptr(err.as_ptr()) }.to_string_lossy().into_owned();
            return Err(OfiError(format!("provider {provider:?}: {msg}")));
        }
        let text = |b: &[c_char; 64]| {
            // SAFETY: snprintf NUL-terminated both names within 64 bytes.
            unsafe { CStr::from_ptr(b.as_ptr()) }.to_string_lossy().into_owned()
        };
        // SAFETY: plain constant getters.
        let (waw, virt, flag_completion, flag_delivery, flag_remote_cq_data, eagain) = unsafe {
            (
                ordo_ofi_order_waw(),
                ordo_ofi_mr_virt_addr(),
                ordo_ofi_flag_completion(),
                ordo_ofi_flag_delivery_complete(),
                ordo_ofi_flag_remote_cq_data(),
                ordo_ofi_eagain() as i64,
            )
        };
        let attr = ProviderAttr {
            provider: text(&a.prov_name),
            fabric: text(&a.fabric_name),
            write_after_write: (a.tx_msg_order & waw != 0).then_some(a.max_order_waw_size),
            max_msg_size: a.max_msg_size,
            tx_size: a.tx_size,
            virt_addr: a.mr_mode & virt != 0,
            manual_progress: a.data_progress_manual != 0,
            key: a.key,
            cq_data_size: a.cq_data_size,
        };
        Ok(Endpoint {
            raw,
            kind,
            staging,
            region,
            attr,
            flag_completion,
            flag_delivery,
            flag_remote_cq_data,
            eagain,
        })
    }

    /// What the provider promised.
    pub fn attr(&self) -> &ProviderAttr {
        &self.attr
    }

    /// This endpoint's address, to hand to peers.
    pub fn name(&mut self) -> Result<Vec<u8>, OfiError> {
        let mut buf = vec![0u8; 256];
        let mut len = buf.len();
        // SAFETY: buf is valid for len bytes; the shim writes at most len.
        let ret = unsafe { ordo_ofi_name(self.raw, buf.as_mut_ptr().cast(), &mut len) };
        if ret != 0 {
            return Err(OfiError(format!("fi_getname: {}", strerror(ret as i64))));
        }
        buf.truncate(len);
        Ok(buf)
    }

    /// Inserts a peer's address into the address vector.
    pub fn insert_peer(&mut self, name: &[u8]) -> Result<u64, OfiError> {
        let mut a = 0u64;
        // Providers read as many bytes as their address format has; pad so
        // a short name from a lying peer is never read past its end.
        let mut padded = name.to_vec();
        padded.resize(name.len().max(256), 0);
        // SAFETY: padded is valid for 256 bytes, more than any address.
        let ret = unsafe { ordo_ofi_av_insert(self.raw, padded.as_ptr().cast(), &mut a) };
        if ret != 0 {
            return Err(OfiError(format!("fi_av_insert: {}", strerror(ret as i64))));
        }
        Ok(a)
    }

    /// Removes a peer's address.
    pub fn remove_peer(&mut self, fi_addr: u64) {
        // SAFETY: a handle fi_av_insert returned; removing twice is an error
        // libfabric reports, not undefined behaviour.
        let ret = unsafe { ordo_ofi_av_remove(self.raw, fi_addr) };
        if ret != 0 {
            tracing::debug!(err = %strerror(ret as i64), "fi_av_remove");
        }
    }

    /// Posts a write of `[offset, offset+len)` of the region to `remote_addr`
    /// (already translated for the provider's `mr_mode`) at `dest`.
    /// Signaled writes complete only when the data is visible at the peer
    /// (`FI_DELIVERY_COMPLETE`).
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &mut self,
        via: Option<usize>,
        staged: Option<usize>,
        offset: usize,
        len: usize,
        dest: u64,
        remote_addr: u64,
        key: u64,
        context: u64,
        flags: WriteFlags,
    ) -> Result<Posted, OfiError> {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.region.len()),
            "write outside the region"
        );
        let f = if flags.completion { self.flag_completion } else { 0 }
            | if flags.delivery { self.flag_delivery } else { 0 }
            | if flags.ring.is_some() { self.flag_remote_cq_data } else { 0 };
        let data = flags.ring.unwrap_or(0);
        if let Some(s) = staged {
            assert!(
                s.checked_add(len).is_some_and(|end| end <= self.staging.len()),
                "staged outside the buffer"
            );
        }
        let via = via.map_or(-1, |s| s as i64);
        let staged = staged.map_or(-1, |s| s as i64);
        // SAFETY: the source range lies inside the registered region or
        // staging buffer (asserted).
        let ret = unsafe {
            ordo_ofi_write(self.raw, via, staged, offset, len, dest, remote_addr, key, context, f, data)
        };
        match ret as i64 {
            0 => Ok(Posted::Yes),
            r if r == self.eagain => Ok(Posted::Again),
            r => Err(OfiError(format!("fi_writemsg: {}", strerror(r)))),
        }
    }

    /// Drives progress and appends the completions now available to `out`
    /// (at most 32 per call). Returns how many.
    pub fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, OfiError> {
        let mut buf = [Completion::default(); 32];
        // SAFETY: buf holds 32 entries, the most the shim writes.
        let n = unsafe { ordo_ofi_poll(self.raw, buf.as_mut_ptr(), buf.len()) };
        if n < 0 {
            return Err(OfiError(format!("fi_cq_read: {}", strerror(n as i64))));
        }
        out.extend_from_slice(&buf[..n as usize]);
        Ok(n as usize)
    }

    /// The completion queue's wait fd, where the provider has one: block
    /// on it (readable) after [`Endpoint::try_wait`] said yes.
    pub fn wait_fd(&self) -> Option<i32> {
        // SAFETY: a getter on a live handle.
        let fd = unsafe { ordo_ofi_wait_fd(self.raw) };
        (fd >= 0).then_some(fd)
    }

    /// Whether blocking on the wait fd is safe now (`fi_trywait`: nothing
    /// is pending that only polling would report).
    pub fn try_wait(&mut self) -> bool {
        // SAFETY: a call on a live handle, serialised by `&mut self`.
        unsafe { ordo_ofi_trywait(self.raw) == 0 }
    }

    /// The kind of endpoint.
    pub fn kind(&self) -> EndpointType {
        self.kind
    }

    /// How many connection slots a connected endpoint has.
    pub fn max_slots() -> usize {
        // SAFETY: a constant getter.
        unsafe { ordo_ofi_max_eps() }
    }

    /// Connected endpoints: starts connecting `slot` to the passive
    /// endpoint `addr` with private data `param`.
    pub fn connect(&mut self, slot: usize, addr: &[u8], param: &[u8]) -> Result<(), OfiError> {
        assert_eq!(self.kind, EndpointType::Msg);
        // SAFETY: both buffers are valid for their lengths.
        let ret = unsafe {
            ordo_ofi_msg_connect(
                self.raw,
                slot,
                addr.as_ptr().cast(),
                addr.len(),
                param.as_ptr().cast(),
                param.len(),
            )
        };
        if ret != 0 {
            return Err(OfiError(format!("fi_connect: {}", strerror(ret as i64))));
        }
        Ok(())
    }

    /// Connected endpoints: the next connection event, if any.
    pub fn event(&mut self) -> Result<Option<CmEvent>, OfiError> {
        assert_eq!(self.kind, EndpointType::Msg);
        // SAFETY: an all-zero RawCm is valid; the shim fills it.
        let mut cm: RawCm = unsafe { std::mem::zeroed() };
        // SAFETY: cm is a valid out-pointer.
        let ret = unsafe { ordo_ofi_msg_event(self.raw, &mut cm) };
        if ret < 0 {
            return Err(OfiError(format!("fi_eq_read: {}", strerror(ret as i64))));
        }
        if ret == 0 {
            return Ok(None);
        }
        let slot = (cm.slot != u64::MAX).then_some(cm.slot as usize);
        Ok(Some(match cm.kind {
            1 => CmEvent::Request {
                request: Request(cm.request),
                param: cm.param[..(cm.param_len as usize).min(64)].to_vec(),
            },
            2 => CmEvent::Connected { slot: slot.unwrap_or(usize::MAX) },
            3 => CmEvent::Shutdown { slot: slot.unwrap_or(usize::MAX) },
            _ => CmEvent::Error { slot, err: cm.err },
        }))
    }

    /// Accepts a connection request on `slot`.
    pub fn accept(&mut self, request: Request, slot: usize) -> Result<(), OfiError> {
        // SAFETY: the request came from `event` and is answered once (moved).
        let ret = unsafe { ordo_ofi_msg_accept(self.raw, request.0, slot) };
        if ret != 0 {
            return Err(OfiError(format!("fi_accept: {}", strerror(ret as i64))));
        }
        Ok(())
    }

    /// Rejects a connection request.
    pub fn reject(&mut self, request: Request) {
        // SAFETY: the request came from `event` and is answered once (moved).
        unsafe { ordo_ofi_msg_reject(self.raw, request.0) }
    }

    /// Reliable datagrams: opens a send endpoint in `slot` for the writes
    /// to one peer (pass the slot to [`Endpoint::write`]). `Ok(false)`
    /// where the provider needs registrations bound per endpoint (then
    /// every write goes through the main endpoint).
    pub fn open_send_endpoint(&mut self, slot: usize) -> Result<bool, OfiError> {
        // SAFETY: a call on a live handle; the shim checks the slot.
        let ret = unsafe { ordo_ofi_rdm_send_ep(self.raw, slot) };
        match ret {
            0 => Ok(true),
            r if -r == libc::ENOSYS => Ok(false),
            r => Err(OfiError(format!("fi_endpoint (send): {}", strerror(r as i64)))),
        }
    }

    /// Closes the connection (or send endpoint) in `slot`.
    pub fn close_slot(&mut self, slot: usize) {
        // SAFETY: closing an empty or out-of-range slot is a no-op.
        unsafe { ordo_ofi_msg_close(self.raw, slot) }
    }

    /// The staging buffer writes are sent from.
    pub fn staging(&self) -> &Region {
        &self.staging
    }

    /// The region this endpoint registered.
    pub fn region(&self) -> &Region {
        &self.region
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // SAFETY: closes every object the shim opened, once; the region is
        // dropped only after this (field order).
        unsafe { ordo_ofi_close(self.raw) };
    }
}
