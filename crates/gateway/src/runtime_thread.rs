//! Background threads (admin listener, health checks, discovery): each a named OS thread
//! running one current-thread tokio runtime, off the workers' event loops.

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
