//! Shuffle sharding: deal a hand of distinct queues from a deck using the
//! flow hash as a mixed-radix number.

use thiserror::Error;

/// Largest hand that fits the 60-bit entropy limit with hand ≤ deck.
pub const MAX_HAND_SIZE: usize = 15;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DealerError {
    #[error("deck size {0} must be positive")]
    EmptyDeck(usize),
    #[error("hand size {hand} must be in 1..={max} and not exceed deck size {deck}")]
    BadHand {
        hand: usize,
        deck: usize,
        max: usize,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dealer {
    deck_size: usize,
    hand_size: usize,
}

impl Dealer {
    pub fn new(deck_size: usize, hand_size: usize) -> Result<Self, DealerError> {
        if deck_size == 0 {
            return Err(DealerError::EmptyDeck(deck_size));
        }
        if hand_size == 0 || hand_size > deck_size || hand_size > MAX_HAND_SIZE {
            return Err(DealerError::BadHand {
                hand: hand_size,
                deck: deck_size,
                max: MAX_HAND_SIZE,
            });
        }
        Ok(Dealer {
            deck_size,
            hand_size,
        })
    }

    pub fn deck_size(&self) -> usize {
        self.deck_size
    }

    pub fn hand_size(&self) -> usize {
        self.hand_size
    }

    /// Deals the hand for `hash` into `hand` and returns the filled prefix.
    ///
    /// Digit i of the hash in radix (deck − i) picks the i-th card among the
    /// cards not dealt yet, so every ordered hand is reachable exactly once
    /// per deck·(deck−1)·… hash values: uniform for a uniform hash.
    pub fn deal<'a>(&self, mut hash: u64, hand: &'a mut [usize; MAX_HAND_SIZE]) -> &'a [usize] {
        let mut sorted = [0usize; MAX_HAND_SIZE];
        for (i, slot) in hand.iter_mut().enumerate().take(self.hand_size) {
            let radix = (self.deck_size - i) as u64;
            let mut card = (hash % radix) as usize;
            hash /= radix;
            // Skip over the cards already dealt, in ascending order.
            let mut pos = 0;
            while pos < i && sorted[pos] <= card {
                card += 1;
                pos += 1;
            }
            // Keep `sorted` ascending by inserting at `pos`.
            sorted.copy_within(pos..i, pos + 1);
            sorted[pos] = card;
            *slot = card;
        }
        &hand[..self.hand_size]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn rejects_bad_shapes() {
        assert!(Dealer::new(0, 1).is_err());
        assert!(Dealer::new(4, 5).is_err());
        assert!(Dealer::new(4, 0).is_err());
        assert!(Dealer::new(100, 16).is_err());
        assert!(Dealer::new(128, 6).is_ok());
    }

    #[test]
    fn hands_are_distinct_and_in_range() {
        let d = Dealer::new(128, 15).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut hand = [0; MAX_HAND_SIZE];
        for _ in 0..2000 {
            let h = d.deal(rng.random(), &mut hand).to_vec();
            let mut s = h.clone();
            s.sort();
            s.dedup();
            assert_eq!(s.len(), 15);
            assert!(h.iter().all(|&c| c < 128));
        }
    }

    #[test]
    fn every_hand_reachable_once_for_small_deck() {
        // deck 5, hand 3: hash values 0..60 give each of the 60 ordered hands once.
        let d = Dealer::new(5, 3).unwrap();
        let mut hand = [0; MAX_HAND_SIZE];
        let mut seen = std::collections::HashSet::new();
        for h in 0..60u64 {
            assert!(seen.insert(d.deal(h, &mut hand).to_vec()));
        }
        assert_eq!(seen.len(), 60);
        assert_eq!(d.deal(0, &mut hand), &[0, 1, 2]);
    }

    // ------------------------------------------------ crush probability check

    /// Minimal unsigned big integer (base 2^32), enough for C(q,h)^e.
    #[derive(Clone, Debug, PartialEq, Eq)]
    struct BigUint(Vec<u32>);

    impl BigUint {
        fn from_u128(mut v: u128) -> Self {
            let mut d = Vec::new();
            while v > 0 {
                d.push(v as u32);
                v >>= 32;
            }
            BigUint(d)
        }
        fn mul(&self, o: &BigUint) -> BigUint {
            let mut r = vec![0u64; self.0.len() + o.0.len() + 1];
            for (i, &a) in self.0.iter().enumerate() {
                let mut carry = 0u64;
                for (j, &b) in o.0.iter().enumerate() {
                    let t = r[i + j] + u64::from(a) * u64::from(b) + carry;
                    r[i + j] = t & 0xffff_ffff;
                    carry = t >> 32;
                }
                let mut k = i + o.0.len();
                while carry > 0 {
                    let t = r[k] + carry;
                    r[k] = t & 0xffff_ffff;
                    carry = t >> 32;
                    k += 1;
                }
            }
            BigUint::norm(r.into_iter().map(|x| x as u32).collect())
        }
        fn norm(mut d: Vec<u32>) -> BigUint {
            while d.last() == Some(&0) {
                d.pop();
            }
            BigUint(d)
        }
        fn add(&self, o: &BigUint) -> BigUint {
            let n = self.0.len().max(o.0.len()) + 1;
            let mut r = Vec::with_capacity(n);
            let mut carry = 0u64;
            for i in 0..n {
                let t = u64::from(*self.0.get(i).unwrap_or(&0))
                    + u64::from(*o.0.get(i).unwrap_or(&0))
                    + carry;
                r.push(t as u32);
                carry = t >> 32;
            }
            BigUint::norm(r)
        }
        /// self − o, requires self ≥ o.
        fn sub(&self, o: &BigUint) -> BigUint {
            let mut r = Vec::with_capacity(self.0.len());
            let mut borrow = 0i64;
            for i in 0..self.0.len() {
                let mut t = i64::from(self.0[i]) - i64::from(*o.0.get(i).unwrap_or(&0)) - borrow;
                borrow = 0;
                if t < 0 {
                    t += 1 << 32;
                    borrow = 1;
                }
                r.push(t as u32);
            }
            assert_eq!(borrow, 0, "negative result");
            BigUint::norm(r)
        }
        fn pow(&self, e: u32) -> BigUint {
            let mut r = BigUint::from_u128(1);
            for _ in 0..e {
                r = r.mul(self);
            }
            r
        }
        fn bits(&self) -> usize {
            match self.0.last() {
                None => 0,
                Some(&top) => (self.0.len() - 1) * 32 + (32 - top.leading_zeros() as usize),
            }
        }
        /// Mantissa (top 64 bits) and binary exponent: self ≈ m · 2^exp.
        fn to_f64_parts(&self) -> (f64, i64) {
            let bits = self.bits();
            let shift = bits.saturating_sub(64);
            let mut m = 0u128;
            for i in (shift..bits).rev() {
                let bit = (self.0[i / 32] >> (i % 32)) & 1;
                m = (m << 1) | u128::from(bit);
            }
            (m as f64, shift as i64)
        }
    }

    fn ratio(n: &BigUint, d: &BigUint) -> f64 {
        let (nm, ne) = n.to_f64_parts();
        let (dm, de) = d.to_f64_parts();
        nm / dm * 2f64.powi((ne - de) as i32)
    }

    fn binom(n: u64, k: u64) -> u128 {
        let mut r: u128 = 1;
        for i in 0..k {
            r = r * u128::from(n - i) / u128::from(i + 1);
        }
        r
    }

    /// Exact P(crushed) = Σ_j (−1)^j C(h,j) (C(q−j,h)/C(q,h))^e.
    fn exact_crush_probability(h: u64, q: u64, e: u32) -> f64 {
        let den = BigUint::from_u128(binom(q, h)).pow(e);
        let mut pos = BigUint::from_u128(0);
        let mut neg = BigUint::from_u128(0);
        for j in 0..=h {
            let term =
                BigUint::from_u128(binom(h, j)).mul(&BigUint::from_u128(binom(q - j, h)).pow(e));
            if j % 2 == 0 {
                pos = pos.add(&term);
            } else {
                neg = neg.add(&term);
            }
        }
        ratio(&pos.sub(&neg), &den)
    }

    /// (hand, queues, [p for 1, 4, 16 elephants]) from the Kubernetes docs.
    const TABLE: [(u64, u64, [f64; 3]); 11] = [
        (12, 32, [4.43e-09, 0.1143, 0.9935]),
        (10, 32, [1.55e-08, 0.0626, 0.9753]),
        (10, 64, [6.60e-12, 4.56e-04, 0.5000]),
        (9, 64, [3.63e-11, 4.55e-04, 0.4282]),
        (8, 64, [2.26e-10, 4.89e-04, 0.3594]),
        (8, 128, [6.99e-13, 3.41e-06, 0.02746]),
        (7, 128, [1.06e-11, 6.96e-06, 0.02406]),
        (7, 256, [7.60e-14, 6.73e-08, 6.71e-04]),
        (6, 256, [2.71e-12, 2.95e-07, 8.90e-04]),
        (6, 512, [4.12e-14, 4.98e-09, 2.26e-05]),
        (6, 1024, [6.34e-16, 8.09e-11, 4.52e-07]),
    ];
    const ELEPHANTS: [u32; 3] = [1, 4, 16];

    #[test]
    fn exact_probabilities_match_table() {
        for (h, q, ps) in TABLE {
            for (k, &e) in ELEPHANTS.iter().enumerate() {
                let got = exact_crush_probability(h, q, e);
                let rel = (got - ps[k]).abs() / ps[k];
                // The table has 3-4 significant digits.
                assert!(
                    rel < 6e-3,
                    "h={h} q={q} e={e}: exact {got:e}, table {:e}",
                    ps[k]
                );
            }
        }
    }

    #[test]
    fn dealer_simulation_matches_table_where_resolvable() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
        let mut mouse = [0; MAX_HAND_SIZE];
        let mut elephant = [0; MAX_HAND_SIZE];
        let mut checked = 0;
        for (h, q, ps) in TABLE {
            let dealer = Dealer::new(q as usize, h as usize).unwrap();
            for (k, &e) in ELEPHANTS.iter().enumerate() {
                let p = ps[k];
                // Resolvable: enough expected hits for a tight binomial check.
                let trials: u64 = 40_000;
                if p * (trials as f64) < 200.0 {
                    continue;
                }
                let mut covered = vec![0u32; q as usize];
                let mut crushed = 0u64;
                for t in 1..=trials as u32 {
                    for _ in 0..e {
                        for &c in dealer.deal(rng.random(), &mut elephant) {
                            covered[c] = t;
                        }
                    }
                    if dealer
                        .deal(rng.random(), &mut mouse)
                        .iter()
                        .all(|&c| covered[c] == t)
                    {
                        crushed += 1;
                    }
                }
                let est = crushed as f64 / trials as f64;
                let sigma = (p * (1.0 - p) / trials as f64).sqrt();
                assert!(
                    (est - p).abs() < 5.0 * sigma,
                    "h={h} q={q} e={e}: simulated {est}, table {p} (σ {sigma})"
                );
                checked += 1;
            }
        }
        // (12,32)/(10,32) at 4 and 16 elephants and all 16-elephant rows down to (7,128).
        assert!(checked >= 9, "{checked}");
    }
}
