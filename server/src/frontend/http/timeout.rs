//! The one timeout helper for the front doors: a future's output, or
//! `None` when its deadline passes first. The future is polled before the
//! timer, so an output that is ready wins a tie; on timeout the future is
//! dropped, as with any cancelled future.

use std::future::Future;
use std::time::Duration;

use futures_lite::future;

/// `fut`'s output, or None when `wait` passes first.
pub(crate) async fn within<T>(wait: Duration, fut: impl Future<Output = T>) -> Option<T> {
    future::or(async { Some(fut.await) }, async {
        glommio::timer::sleep(wait).await;
        None
    })
    .await
}
