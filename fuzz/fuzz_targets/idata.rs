//! The idata codec: round trip, and the fallback rule exactly when a field does not fit.
#![no_main]
use libfuzzer_sys::fuzz_target;
use splitnet_messaging::wire::Idata;

fuzz_target!(|v: (u32, u32, u32, u32)| {
    let (raw, pool, element, len) = v;
    assert_eq!(Idata::from_u32(raw).to_u32(), raw);
    let fits = pool < 256 && element < 256 && len < 65_536;
    match Idata::new(pool, element, len) {
        Some(i) => {
            assert!(fits);
            let back = Idata::from_u32(i.to_u32());
            assert_eq!(
                (
                    u32::from(back.pool_ref),
                    u32::from(back.element),
                    u32::from(back.length)
                ),
                (pool, element, len)
            );
        }
        None => assert!(!fits),
    }
});
