//! Writes of one HTTP/2 connection gathered into few `writev` calls.
//!
//! h2 hands its transport one DATA frame at a time and flushes after each
//! (`FramedWrite::poll_ready` flushes whenever a large frame is pending), so
//! a connection carrying many watch streams made one `writev` per event per
//! watcher. This transport hands each write to the TLS session, which
//! encrypts it into its own outgoing buffer (the one copy TLS makes anyway),
//! and answers the first flush after new writes by deferring it: it wakes
//! the connection's task and reports success. h2 ends every poll of its
//! connection with a flush, so when the task runs again (having taken every
//! frame queued meanwhile) a flush with nothing new written sends every
//! record as one write. Bytes wait at most one task poll, or none once
//! [`FLUSH_AT`] bytes are buffered.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes buffered at most before a write goes through (rustls's own limit
/// on its outgoing buffer is the same).
const CAPACITY: usize = 64 * 1024;
/// A flush with this much buffered is never deferred.
const FLUSH_AT: usize = 32 * 1024;

/// A transport that takes bytes into a buffer of its own, to be written out
/// at its next flush.
pub trait Buffered: AsyncWrite + Unpin {
    /// Takes what of `bufs` fits in the buffer: 0 when it is full.
    fn buffer(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize>;
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Buffered for tokio_rustls::server::TlsStream<IO> {
    fn buffer(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        // Encrypted into the session's outgoing records; the socket is
        // written at the next flush.
        io::Write::write_vectored(&mut self.get_mut().1.writer(), bufs)
    }
}

pub struct Gathered<T> {
    inner: T,
    /// Bytes buffered in `inner` since it was last flushed.
    pending: usize,
    /// Writes arrived since the last flush request.
    written: bool,
}

impl<T> Gathered<T> {
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            pending: 0,
            written: false,
        }
    }
}

impl<T: Buffered> Gathered<T> {
    /// Writes everything buffered out.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(Pin::new(&mut self.inner).poll_flush(cx))?;
        self.pending = 0;
        Poll::Ready(Ok(()))
    }
}

impl<T: Buffered> AsyncWrite for Gathered<T> {
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
        if total == 0 {
            return Poll::Ready(Ok(0));
        }
        if this.pending > 0 && this.pending + total > CAPACITY {
            ready!(this.poll_drain(cx))?;
        }
        let mut taken = this.inner.buffer(bufs)?;
        if taken == 0 {
            // Full: out with what it holds, then take what fits.
            ready!(this.poll_drain(cx))?;
            taken = this.inner.buffer(bufs)?;
            if taken == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
        }
        this.pending += taken;
        this.written = true;
        Poll::Ready(Ok(taken))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // Deferred only while something is buffered and more may follow.
        if this.written && (1..FLUSH_AT).contains(&this.pending) {
            this.written = false;
            cx.waker().wake_by_ref();
            return Poll::Ready(Ok(()));
        }
        this.written = false;
        this.poll_drain(cx)
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

    /// A buffering transport (as a TLS session is) that records each write
    /// of its buffer to the socket.
    #[derive(Clone, Default)]
    struct Recorder {
        buffered: Arc<Mutex<Vec<u8>>>,
        writes: Arc<Mutex<Vec<Vec<u8>>>>,
    }

    impl Buffered for Recorder {
        fn buffer(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
            let mut b = self.buffered.lock().map_err(|_| io::ErrorKind::Other)?;
            let mut taken = 0;
            for buf in bufs {
                let n = buf.len().min(CAPACITY - b.len());
                b.extend_from_slice(&buf[..n]);
                taken += n;
            }
            Ok(taken)
        }
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            data: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.get_mut().buffer(&[io::IoSlice::new(data)]).into()
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            let mut b = self.buffered.lock().map_err(|_| io::ErrorKind::Other)?;
            if !b.is_empty() {
                let out = std::mem::take(&mut *b);
                self.writes
                    .lock()
                    .map_err(|_| io::ErrorKind::Other)?
                    .push(out);
            }
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn writes(r: &Recorder) -> Vec<Vec<u8>> {
        r.writes.lock().map(|w| w.clone()).unwrap_or_default()
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
        // Nothing buffered: a flush is a plain flush.
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
        // More than FLUSH_AT buffered: the flush is not deferred.
        let big = vec![1u8; FLUSH_AT];
        assert!(Pin::new(&mut g).poll_write(&mut cx, &big).is_ready());
        assert!(Pin::new(&mut g).poll_flush(&mut cx).is_ready());
        let out: usize = writes(&rec).iter().map(Vec::len).sum();
        assert_eq!(out, 4 * chunk.len() + big.len());
        // A write larger than the buffer is taken as far as it fits; the
        // rest is the caller's next write.
        let huge = vec![2u8; CAPACITY + 1];
        assert!(matches!(
            Pin::new(&mut g).poll_write(&mut cx, &huge),
            Poll::Ready(Ok(n)) if n == CAPACITY
        ));
        assert!(matches!(
            Pin::new(&mut g).poll_write(&mut cx, &huge[CAPACITY..]),
            Poll::Ready(Ok(1))
        ));
        // (The first flush after a write is deferred, the next one sends.)
        assert!(Pin::new(&mut g).poll_flush(&mut cx).is_ready());
        assert!(Pin::new(&mut g).poll_flush(&mut cx).is_ready());
        let tail: usize = writes(&rec).iter().rev().take(2).map(Vec::len).sum();
        assert_eq!(tail, huge.len());
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
