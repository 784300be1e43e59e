//! Writes of one HTTP/2 connection gathered into few TLS records and
//! syscalls.
//!
//! h2 hands its transport one DATA frame at a time and flushes after each
//! (`FramedWrite::poll_ready` flushes whenever a large frame is pending), so
//! a connection carrying many watch streams wrote one TLS record and made
//! one `writev` per event per watcher. This transport buffers writes and
//! answers the first flush after new writes by deferring it: it wakes the
//! connection's task and reports success. h2 ends every poll of its
//! connection with a flush, so when the task runs again (having taken every
//! frame queued meanwhile) a flush with nothing new written in between
//! writes the whole buffer through. Bytes wait at most one task poll, or
//! none once [`FLUSH_AT`] bytes are gathered.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes gathered at most before a write goes through.
const CAPACITY: usize = 64 * 1024;
/// A flush with this much gathered is never deferred.
const FLUSH_AT: usize = 32 * 1024;

pub struct Gathered<T> {
    inner: T,
    buf: Vec<u8>,
    /// Bytes of `buf` already written to `inner`.
    sent: usize,
    /// Writes arrived since the last flush request.
    written: bool,
}

impl<T> Gathered<T> {
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            buf: Vec::new(),
            sent: 0,
            written: false,
        }
    }

    fn pending(&self) -> usize {
        self.buf.len() - self.sent
    }
}

impl<T: AsyncWrite + Unpin> Gathered<T> {
    /// Writes everything gathered to `inner`.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.buf.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.buf[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.buf.clear();
        self.sent = 0;
        // A burst's buffer is not kept by an idle connection.
        if self.buf.capacity() > CAPACITY {
            self.buf.shrink_to(CAPACITY);
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Gathered<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(data)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if this.pending() + total > CAPACITY {
            ready!(this.poll_drain(cx))?;
        }
        if total > CAPACITY {
            return Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        }
        for b in bufs {
            this.buf.extend_from_slice(b);
        }
        this.written |= total > 0;
        Poll::Ready(Ok(total))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // Deferred only while something is gathered and more may follow.
        if this.written && (1..FLUSH_AT).contains(&this.pending()) {
            this.written = false;
            cx.waker().wake_by_ref();
            return Poll::Ready(Ok(()));
        }
        this.written = false;
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Gathered<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A transport that records each write it is given.
    #[derive(Clone, Default)]
    struct Recorder(Arc<Mutex<Vec<Vec<u8>>>>);

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            data: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.0
                .lock()
                .map_err(|_| io::ErrorKind::Other)?
                .push(data.to_vec());
            Poll::Ready(Ok(data.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn writes(r: &Recorder) -> Vec<Vec<u8>> {
        r.0.lock().map(|w| w.clone()).unwrap_or_default()
    }

    #[test]
    fn frames_flushed_one_by_one_go_out_as_one_write_on_the_next_poll() {
        let rec = Recorder::default();
        let mut g = Gathered::new(rec.clone());
        let woken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let waker = waker_fn(woken.clone());
        let mut cx = Context::from_waker(&waker);
        // One poll of the connection: three frames, each followed by a flush.
        for frame in [&b"one "[..], b"two ", b"three"] {
            assert!(matches!(
                Pin::new(&mut g).poll_write(&mut cx, frame),
                Poll::Ready(Ok(n)) if n == frame.len()
            ));
            assert!(matches!(
                Pin::new(&mut g).poll_flush(&mut cx),
                Poll::Ready(Ok(()))
            ));
        }
        assert!(writes(&rec).is_empty(), "deferred while frames come");
        assert!(
            woken.load(std::sync::atomic::Ordering::SeqCst) > 0,
            "the task is woken to flush"
        );
        // The next poll flushes with nothing new written: everything goes.
        assert!(matches!(
            Pin::new(&mut g).poll_flush(&mut cx),
            Poll::Ready(Ok(()))
        ));
        assert_eq!(writes(&rec), vec![b"one two three".to_vec()]);
        // Nothing gathered: a flush is a plain flush.
        assert!(matches!(
            Pin::new(&mut g).poll_flush(&mut cx),
            Poll::Ready(Ok(()))
        ));
        assert_eq!(writes(&rec).len(), 1);
    }

    #[test]
    fn a_full_buffer_is_written_without_waiting_for_a_flush() {
        let rec = Recorder::default();
        let mut g = Gathered::new(rec.clone());
        let waker = waker_fn(Arc::default());
        let mut cx = Context::from_waker(&waker);
        let chunk = vec![7u8; CAPACITY / 4 + 1];
        for _ in 0..4 {
            assert!(Pin::new(&mut g).poll_write(&mut cx, &chunk).is_ready());
        }
        let out: usize = writes(&rec).iter().map(Vec::len).sum();
        assert_eq!(out, 3 * chunk.len(), "the fourth chunk did not fit");
        // More than FLUSH_AT gathered: the flush is not deferred.
        let big = vec![1u8; FLUSH_AT];
        assert!(Pin::new(&mut g).poll_write(&mut cx, &big).is_ready());
        assert!(Pin::new(&mut g).poll_flush(&mut cx).is_ready());
        let out: usize = writes(&rec).iter().map(Vec::len).sum();
        assert_eq!(out, 4 * chunk.len() + big.len());
        // A write larger than the buffer goes straight through.
        let huge = vec![2u8; CAPACITY + 1];
        assert!(matches!(
            Pin::new(&mut g).poll_write(&mut cx, &huge),
            Poll::Ready(Ok(n)) if n == huge.len()
        ));
        assert_eq!(writes(&rec).last().map(Vec::len), Some(huge.len()));
    }

    fn waker_fn(count: Arc<std::sync::atomic::AtomicUsize>) -> std::task::Waker {
        struct Count(Arc<std::sync::atomic::AtomicUsize>);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        std::task::Waker::from(Arc::new(Count(count)))
    }
}
