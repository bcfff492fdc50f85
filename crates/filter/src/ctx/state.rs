//! [`FilterState`]: the box a request's filter state lives in, and its reuse on the thread.

use super::*;

/// What the filters of one request share across its stages ([`State`]), owned by the
/// request from before the `pre` stage to after its `post` stage.
///
/// One pointer wide: the state lives in a box, so the request future that keeps it across
/// the proxy stage stays small. The box is reused: a dropped state leaves its allocation
/// (its value dropped) to the next one made on the same thread ([`SPARE`]), which writes a
/// whole new value into it.
pub struct FilterState(pub(super) ManuallyDrop<Box<State>>);

thread_local! {
    /// The allocation of the last state dropped on this thread, without a value: a worker
    /// makes one per request with filters, one at a time or a few at once, so this saves
    /// an allocation and a free per request.
    static SPARE: Cell<Option<Box<MaybeUninit<State>>>> = const { Cell::new(None) };
}

impl Drop for FilterState {
    fn drop(&mut self) {
        // SAFETY: the box is taken out of the `ManuallyDrop` once, here, and `self.0` is not
        // used again.
        let state = unsafe { ManuallyDrop::take(&mut self.0) };
        let raw = Box::into_raw(state);
        // SAFETY: `raw` comes from a `Box<State>` holding a valid value, dropped exactly
        // once here. What is left is the box's allocation holding no value: a
        // `Box<MaybeUninit<State>>` (same size and alignment) owns it from then on and frees
        // it without dropping anything when it is dropped.
        let spare = unsafe {
            std::ptr::drop_in_place(raw);
            Box::from_raw(raw.cast::<MaybeUninit<State>>())
        };
        // Past the thread's destructors the spare is simply freed.
        let _ = SPARE.try_with(move |s| s.set(Some(spare)));
    }
}

impl std::ops::Deref for FilterState {
    type Target = State;
    fn deref(&self) -> &State {
        &self.0
    }
}

impl std::ops::DerefMut for FilterState {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.0
    }
}

impl FilterState {
    /// The state of a request with filters, before its `pre` stage. `request_id`: the
    /// listener's request id field name.
    pub fn new(
        method: &Method,
        client: SocketAddr,
        tls: Option<&keymaster_http::headers::TlsFacts>,
        route: Arc<str>,
        request_id: &HeaderName,
    ) -> FilterState {
        // Every value that takes a call is made first, so that the state is then written
        // straight into its allocation (the spare, else a new one), not built on the stack
        // and copied in.
        let timed = crate::sample_timing();
        let method = method.clone();
        let tls = tls.map(|t| t.client_identity.clone());
        let state = (SPARE.try_with(Cell::take).ok().flatten()).unwrap_or_else(Box::new_uninit);
        FilterState(ManuallyDrop::new(Box::write(
            state,
            State {
                stage: FilterStage::Pre,
                head_touched: false,
                may_set_request_id: false,
                timed,
                request_id_len: request_id.as_str().len(),
                method,
                client,
                tls,
                route,
                cluster: None,
                local: None,
                kept: None,
                extras: None,
            },
        )))
    }
}
