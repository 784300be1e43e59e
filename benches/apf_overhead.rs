//! Per-request cost of API Priority and Fairness on an idle level:
//! classify + estimate + enqueue/dispatch + finish, as the HTTP filter does it.

use criterion::{criterion_group, criterion_main, Criterion};
use kshard::flowcontrol::{Apf, EstimateInputs, RequestDigest, ServerConfig};

fn digest() -> RequestDigest {
    RequestDigest {
        user: "alice".into(),
        groups: vec!["devs".into(), "system:authenticated".into()],
        is_resource: true,
        verb: "get".into(),
        api_group: "demo.kshard.dev".into(),
        api_version: "v1".into(),
        resource: "widgets".into(),
        subresource: String::new(),
        namespace: "default".into(),
        name: "w1".into(),
        path: "/apis/demo.kshard.dev/v1/namespaces/default/widgets/w1".into(),
        is_long_running_non_watch: false,
    }
}

fn overhead(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let apf = Apf::new(ServerConfig::default());
    let d = digest();
    c.bench_function("apf admit+finish, idle global-default level", |b| {
        b.to_async(&rt).iter(|| async {
            let seats = apf
                .admit(
                    &d,
                    EstimateInputs::Simple,
                    None,
                    std::future::pending::<()>(),
                )
                .await
                .expect("admitted");
            seats.finish();
        })
    });
    let list = EstimateInputs::List {
        object_count: 10_000,
        avg_object_size: 1024,
        from_watch_cache: true,
    };
    c.bench_function("apf admit+finish, wide LIST estimate", |b| {
        b.to_async(&rt).iter(|| async {
            let seats = apf
                .admit(&d, list, None, std::future::pending::<()>())
                .await
                .expect("admitted");
            seats.finish();
        })
    });
}

criterion_group!(benches, overhead);
criterion_main!(benches);
