//! Background threads (admin listener, health checks, discovery): each a named OS thread
//! running one current-thread tokio runtime, off the workers' event loops. And hyper's
//! executor on a worker's own event loop ([`LocalExec`]).

use std::future::Future;
use std::thread::JoinHandle;

/// Start thread `name` and run the future `task` makes on its own runtime until it ends. The
/// future is made on the new thread, so it need not be `Send`.
pub(crate) fn spawn<F, Fut>(name: &str, task: F) -> std::io::Result<JoinHandle<()>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let thread = name.to_string();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, %thread, "cannot start the thread's runtime");
                    return;
                }
            };
            rt.block_on(task());
        })
}

/// hyper's executor on the current thread's local runtime (a worker's, for HTTP/2 from clients
/// and to origins: bodies are `!Send`). Each future is boxed before it is spawned: tokio
/// moves a task's future by value when it spawns it and again when it stores its output,
/// and a client stream's future holds the whole proxy stage (several KB), so one copy into
/// the box replaces three of the whole future.
#[derive(Clone, Copy)]
pub(crate) struct LocalExec;

impl<F> hyper::rt::Executor<F> for LocalExec
where
    F: Future + 'static,
{
    fn execute(&self, fut: F) {
        tokio::task::spawn_local(Box::pin(fut));
    }
}
