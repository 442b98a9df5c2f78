//! Traces over OTLP/gRPC, through the OpenTelemetry SDK, when an endpoint is set.
//!
//! The standard environment variables work as every OpenTelemetry user expects, and win over
//! the `telemetry.*` keys that mirror them: `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) ↔ `telemetry.endpoint`, `OTEL_SERVICE_NAME` ↔
//! `telemetry.service_name` (default `hark-<role>`), `OTEL_RESOURCE_ATTRIBUTES` ↔
//! `telemetry.resource_attributes`, `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` ↔
//! `telemetry.sampler` and `telemetry.sampler_arg`. Without an endpoint nothing is exported and
//! [`crate::trace`] carries W3C trace context by itself.
//!
//! Context crosses processes through the OpenTelemetry propagator API (W3C TraceContext and
//! Baggage), installed here for every process.

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::{
    KeyValue, propagation::TextMapCompositePropagator, trace::TracerProvider as _,
};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::{
    propagation::{BaggagePropagator, TraceContextPropagator},
    trace::{Sampler, SdkTracerProvider},
};

use crate::config::{Error, TelemetryConfig};

static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported (an endpoint is set and the exporter was built).
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// Flushes and stops the exporter when dropped, so that a stopping process sends its last spans.
#[derive(Debug, Default)]
pub struct Guard(Option<SdkTracerProvider>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(provider) = self.0.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("hark: the trace exporter did not shut down cleanly: {e}");
        }
    }
}

/// What the process exports to, read from the environment and `telemetry.*`.
#[derive(Debug, Clone)]
pub struct Settings {
    pub endpoint: Option<String>,
    pub service_name: String,
    pub attributes: Vec<(String, String)>,
    /// `None` when `OTEL_TRACES_SAMPLER` is set: the SDK reads it (and its argument) itself.
    pub sampler: Option<Sampler>,
}

impl Settings {
    /// The settings of the process running `role` (`control`, `gateway`, `worker`, `dev`).
    pub fn read(
        config: &TelemetryConfig,
        role: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, Error> {
        let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let endpoint = set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT"))
            .or_else(|| Some(config.endpoint.trim().to_owned()).filter(|e| !e.is_empty()));
        let service_name = set("OTEL_SERVICE_NAME")
            .or_else(|| Some(config.service_name.trim().to_owned()).filter(|s| !s.is_empty()))
            .unwrap_or_else(|| format!("hark-{role}"));
        let attributes = if set("OTEL_RESOURCE_ATTRIBUTES").is_some() {
            // The SDK's resource detector reads the variable itself.
            Vec::new()
        } else {
            attributes(&config.resource_attributes)?
        };
        let sampler = if set("OTEL_TRACES_SAMPLER").is_some() {
            None
        } else {
            Some(sampler(&config.sampler, &config.sampler_arg)?)
        };
        Ok(Self {
            endpoint,
            service_name,
            attributes,
            sampler,
        })
    }
}

fn attributes(text: &str) -> Result<Vec<(String, String)>, Error> {
    text.split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => {
                Ok((key.trim().to_owned(), value.trim().to_owned()))
            }
            _ => Err(Error::Key {
                key: "telemetry.resource_attributes".into(),
                message: format!(
                    "`{pair}` is not `key=value`; write them as `deployment.environment=prod,team=chat`"
                ),
            }),
        })
        .collect()
}

fn sampler(name: &str, arg: &str) -> Result<Sampler, Error> {
    let ratio = || -> Result<f64, Error> {
        if arg.trim().is_empty() {
            return Ok(1.0);
        }
        arg.trim()
            .parse::<f64>()
            .ok()
            .filter(|r| (0.0..=1.0).contains(r))
            .ok_or_else(|| Error::Key {
                key: "telemetry.sampler_arg".into(),
                message: format!("`{arg}` is not a ratio between 0 and 1, e.g. 0.25"),
            })
    };
    Ok(match name.trim() {
        "" | "parentbased_always_on" => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
        "always_on" => Sampler::AlwaysOn,
        "always_off" => Sampler::AlwaysOff,
        "parentbased_always_off" => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
        "traceidratio" => Sampler::TraceIdRatioBased(ratio()?),
        "parentbased_traceidratio" => {
            Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio()?)))
        }
        other => {
            return Err(Error::Key {
                key: "telemetry.sampler".into(),
                message: format!(
                    "`{other}` is not a sampler: use always_on, always_off, traceidratio, \
                     parentbased_always_on, parentbased_always_off or parentbased_traceidratio"
                ),
            });
        }
    })
}

/// Installs the propagator and, with an endpoint, the exporter; returns the tracing layer that
/// feeds it (`None` without an endpoint) and the guard that flushes it. Call inside the Tokio
/// runtime.
pub fn init<S>(
    config: &TelemetryConfig,
    role: &str,
) -> Result<
    (
        Option<tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>>,
        Guard,
    ),
    Error,
>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    opentelemetry::global::set_text_map_propagator(TextMapCompositePropagator::new(vec![
        Box::new(TraceContextPropagator::new()),
        Box::new(BaggagePropagator::new()),
    ]));
    let settings = Settings::read(config, role, |name| std::env::var(name).ok())?;
    let Some(endpoint) = settings.endpoint else {
        return Ok((None, Guard::default()));
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint.clone())
        .build()
        .map_err(|e| Error::Key {
            key: "telemetry.endpoint".into(),
            message: format!(
                "cannot export traces to `{}`: {e}; give an OTLP/gRPC address such as \
                 http://127.0.0.1:4317 (OTEL_EXPORTER_OTLP_ENDPOINT wins when set)",
                crate::secret::redact_url(&endpoint)
            ),
        })?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(settings.service_name)
        .with_attributes(
            settings
                .attributes
                .into_iter()
                .map(|(k, v)| KeyValue::new(k, v)),
        )
        .build();
    let mut builder = SdkTracerProvider::builder()
        .with_resource(resource)
        .with_batch_exporter(exporter);
    if let Some(sampler) = settings.sampler {
        builder = builder.with_sampler(sampler);
    }
    let provider = builder.build();
    let tracer = provider.tracer("hark");
    EXPORTING.store(true, Ordering::Relaxed);
    Ok((
        Some(tracing_opentelemetry::layer().with_tracer(tracer)),
        Guard(Some(provider)),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(config: TelemetryConfig, env: &[(&str, &str)]) -> Result<Settings, Error> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::read(&config, "worker", |name| {
            env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn tracing_is_off_without_an_endpoint_and_the_role_names_the_service() {
        let settings = read(TelemetryConfig::default(), &[]).expect("reads");
        assert_eq!(settings.endpoint, None);
        assert_eq!(settings.service_name, "hark-worker");
    }

    #[test]
    fn the_standard_variables_win_over_the_keys_that_mirror_them() {
        let config = TelemetryConfig {
            endpoint: "http://from-config:4317".into(),
            service_name: "from-config".into(),
            resource_attributes: "team=chat, deployment.environment=prod".into(),
            sampler: "traceidratio".into(),
            sampler_arg: "0.5".into(),
        };
        let keys = read(config.clone(), &[]).expect("reads");
        assert_eq!(keys.endpoint.as_deref(), Some("http://from-config:4317"));
        assert_eq!(keys.service_name, "from-config");
        assert_eq!(
            keys.attributes,
            [
                ("team".to_owned(), "chat".to_owned()),
                ("deployment.environment".to_owned(), "prod".to_owned())
            ]
        );
        assert!(matches!(keys.sampler, Some(Sampler::TraceIdRatioBased(r)) if r == 0.5));
        let env = read(
            config,
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://from-env:4317"),
                ("OTEL_SERVICE_NAME", "from-env"),
                ("OTEL_RESOURCE_ATTRIBUTES", "team=env"),
                ("OTEL_TRACES_SAMPLER", "always_on"),
            ],
        )
        .expect("reads");
        assert_eq!(env.endpoint.as_deref(), Some("http://from-env:4317"));
        assert_eq!(env.service_name, "from-env");
        assert!(
            env.attributes.is_empty(),
            "the SDK reads OTEL_RESOURCE_ATTRIBUTES"
        );
        assert!(env.sampler.is_none(), "the SDK reads OTEL_TRACES_SAMPLER");
    }

    #[test]
    fn a_bad_sampler_or_attribute_names_its_key() {
        let bad = |config: TelemetryConfig| read(config, &[]).expect_err("refused").to_string();
        let err = bad(TelemetryConfig {
            sampler: "sometimes".into(),
            ..Default::default()
        });
        assert!(err.contains("telemetry.sampler"), "{err}");
        let err = bad(TelemetryConfig {
            sampler: "traceidratio".into(),
            sampler_arg: "2".into(),
            ..Default::default()
        });
        assert!(err.contains("telemetry.sampler_arg"), "{err}");
        let err = bad(TelemetryConfig {
            resource_attributes: "novalue".into(),
            ..Default::default()
        });
        assert!(err.contains("telemetry.resource_attributes"), "{err}");
    }
}
