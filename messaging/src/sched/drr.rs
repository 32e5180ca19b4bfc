//! Deficit round robin (Shreedhar and Varghese, 1995): a byte-fair share of one server among
//! several queues, whatever the sizes of their frames.
//!
//! Each queue holds a [`Deficit`]. The server visits the backlogged queues in turn; at each
//! visit a queue's deficit grows by its quantum and the queue sends while the deficit is
//! positive, each frame spending its length. A queue found empty loses what it had banked,
//! so idling never buys a burst later. The classic algorithm looks at the next frame's length
//! before sending it; a queue read from a channel cannot, so a frame may overdraw the deficit
//! and the debt is paid at the next visits. Over any run of visits the bytes two backlogged
//! queues send differ by at most one quantum and one frame (the property tests check it).

/// The deficit counter of one queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deficit {
    quantum: u32,
    /// Bytes the queue may still send in this visit; negative after an overdraft.
    deficit: i64,
}

impl Deficit {
    /// A queue that earns `quantum` bytes per visit (at least 1).
    pub fn new(quantum: u32) -> Deficit {
        Deficit {
            quantum: quantum.max(1),
            deficit: 0,
        }
    }

    /// The bytes earned per visit.
    pub fn quantum(&self) -> u32 {
        self.quantum
    }

    /// Changes the quantum from the next visit on.
    pub fn set_quantum(&mut self, quantum: u32) {
        self.quantum = quantum.max(1);
    }

    /// Starts a visit: the quantum is earned. Returns whether the queue may send in it (false
    /// while it still pays off an overdraft).
    pub fn visit(&mut self) -> bool {
        self.deficit += i64::from(self.quantum);
        self.deficit > 0
    }

    /// Whether the queue may send another frame in this visit.
    pub fn may_send(&self) -> bool {
        self.deficit > 0
    }

    /// A frame of `len` bytes was sent.
    pub fn spend(&mut self, len: usize) {
        self.deficit -= i64::try_from(len).unwrap_or(i64::MAX);
    }

    /// The queue was found empty: what it banked is forfeit (a debt stays).
    pub fn emptied(&mut self) {
        self.deficit = self.deficit.min(0);
    }

    /// One visit to a queue that is read as it is served: `next` takes one entry from the
    /// queue and returns its length (0 for an entry that is not a frame), or `None` when the
    /// queue is empty. The visit ends when the deficit is spent, the queue empty, or after
    /// `max` entries. Returns whether the queue may still hold entries (visit it again).
    pub fn serve<E>(
        &mut self,
        max: usize,
        mut next: impl FnMut() -> Result<Option<usize>, E>,
    ) -> Result<bool, E> {
        if !self.visit() {
            return Ok(true);
        }
        for _ in 0..max {
            match next()? {
                None => {
                    self.emptied();
                    return Ok(false);
                }
                Some(len) => self.spend(len),
            }
            if !self.may_send() {
                return Ok(true);
            }
        }
        Ok(true)
    }

    /// Bytes it may still send in this visit (negative: its debt).
    pub fn balance(&self) -> i64 {
        self.deficit
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_visit_sends_up_to_the_quantum_and_one_frame_more() {
        let mut d = Deficit::new(3000);
        assert!(d.visit());
        let mut sent = 0;
        while d.may_send() {
            d.spend(1400);
            sent += 1;
        }
        assert_eq!(
            sent, 3,
            "1400 + 1400 leaves 200, so a third frame overdraws"
        );
        assert_eq!(d.balance(), 3000 - 4200);
        // The debt is paid at the next visit: 1800 left.
        assert!(d.visit());
        assert_eq!(d.balance(), 1800);
    }

    #[test]
    fn a_large_frame_waits_out_its_debt() {
        let mut d = Deficit::new(1000);
        assert!(d.visit());
        d.spend(65_000);
        let skipped = (0..100).take_while(|_| !d.visit()).count();
        assert_eq!(skipped, 64, "64 visits pay 64,000 of the 64,000 owed");
        assert_eq!(d.balance(), 1000);
    }

    #[test]
    fn an_empty_queue_banks_nothing_but_keeps_its_debt() {
        let mut d = Deficit::new(1000);
        d.visit();
        d.emptied();
        assert_eq!(d.balance(), 0);
        d.visit();
        d.spend(5000);
        d.emptied();
        assert_eq!(d.balance(), -4000);
    }

    #[test]
    fn serve_reads_until_the_deficit_the_queue_or_the_budget_ends() {
        let mut queue = std::collections::VecDeque::from([1000, 0, 1000, 1000, 1000]);
        let mut d = Deficit::new(2500);
        let r: Result<bool, ()> = d.serve(100, || Ok(queue.pop_front()));
        assert_eq!(r, Ok(true), "1000 + 0 + 1000 + 1000 overdraws 2500");
        assert_eq!(queue, [1000]);
        assert_eq!(d.balance(), -500);
        let r: Result<bool, ()> = d.serve(100, || Ok(queue.pop_front()));
        assert_eq!(r, Ok(false), "the queue emptied with 1000 of 2000 left");
        assert!(queue.is_empty());
        assert_eq!(d.balance(), 0, "an emptied queue banks nothing");
        // The entry budget ends a visit too; an error ends it at once.
        let mut d = Deficit::new(1 << 20);
        let mut n = 0;
        let r: Result<bool, ()> = d.serve(4, || {
            n += 1;
            Ok(Some(10))
        });
        assert_eq!((r, n), (Ok(true), 4));
        let r: Result<bool, &str> = d.serve(4, || Err("broken"));
        assert_eq!(r, Err("broken"));
        // A visit that only pays debt reads nothing.
        let mut d = Deficit::new(100);
        d.spend(1000);
        let r: Result<bool, ()> = d.serve(4, || unreachable!("read during a debt"));
        assert_eq!(r, Ok(true));
    }

    #[test]
    fn quantum_is_never_zero() {
        let mut d = Deficit::new(0);
        assert_eq!(d.quantum(), 1);
        d.set_quantum(0);
        assert_eq!(d.quantum(), 1);
        assert!(d.visit());
    }

    /// Serves backlogged queues of frames (the sizes given, repeated) for `visits` rounds;
    /// returns the bytes each sent.
    fn serve(quanta: &[u32], sizes: &[Vec<usize>], rounds: usize) -> Vec<u64> {
        let mut d: Vec<Deficit> = quanta.iter().map(|&q| Deficit::new(q)).collect();
        let mut next = vec![0usize; sizes.len()];
        let mut sent = vec![0u64; sizes.len()];
        for _ in 0..rounds {
            for q in 0..sizes.len() {
                if !d[q].visit() {
                    continue;
                }
                while d[q].may_send() {
                    let len = sizes[q][next[q] % sizes[q].len()];
                    next[q] += 1;
                    d[q].spend(len);
                    sent[q] += len as u64;
                }
            }
        }
        sent
    }

    proptest! {
        /// Two always-backlogged queues with equal quanta send within one quantum and one
        /// largest frame of each other, whatever their frame sizes.
        #[test]
        fn equal_quanta_share_bytes_equally(
            quantum in 1u32..200_000,
            a in proptest::collection::vec(1usize..65_536, 1..20),
            b in proptest::collection::vec(1usize..65_536, 1..20),
            rounds in 1usize..300,
        ) {
            let sent = serve(&[quantum, quantum], &[a.clone(), b.clone()], rounds);
            let largest = a.iter().chain(&b).copied().max().unwrap() as u64;
            let gap = sent[0].abs_diff(sent[1]);
            prop_assert!(gap <= u64::from(quantum) + largest, "sent {sent:?}, gap {gap}");
        }

        /// Over many rounds a queue's share follows its quantum.
        #[test]
        fn shares_follow_quanta(
            q1 in 1_000u32..100_000,
            q2 in 1_000u32..100_000,
            len in 64usize..9_000,
        ) {
            let rounds = 400;
            let sent = serve(&[q1, q2], &[vec![len], vec![len]], rounds);
            for (i, q) in [q1, q2].into_iter().enumerate() {
                let earned = u64::from(q) * rounds as u64;
                prop_assert!(sent[i] >= earned && sent[i] < earned + len as u64,
                    "queue {i} sent {} for {earned} earned", sent[i]);
            }
        }
    }
}
