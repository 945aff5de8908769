//! A KServe v2 client over HTTP or Triton's gRPC: model metadata and configuration,
//! inference, and Triton's statistics extension, on hyper (the HTTP stack axum already
//! brings; HTTP/2 for gRPC, with tonic's generated client on top).

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client as HttpClient};
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use trident_core::config::pb;

#[allow(missing_docs, clippy::all)]
mod generated {
    tonic::include_proto!("inference");
}

type GrpcClient = generated::grpc_inference_service_client::GrpcInferenceServiceClient<
    HttpClient<HttpConnector, tonic::body::Body>,
>;

/// The protocol requests use (perf_analyzer's `-i`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Protocol {
    /// KServe v2 HTTP/REST.
    Http,
    /// Triton's gRPC (`inference.GRPCInferenceService`).
    Grpc,
}

/// A tensor a model takes or returns, from its metadata.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TensorInfo {
    /// Name.
    pub name: String,
    /// KServe datatype (`FP32`, `INT64`, `BYTES`, …).
    pub datatype: String,
    /// Shape; -1 marks a variable dimension (the batch one first, for batching models).
    pub shape: Vec<i64>,
}

/// What the bench needs to know about a model.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ModelInfo {
    /// Name.
    pub name: String,
    /// Inputs.
    pub inputs: Vec<TensorInfo>,
    /// Outputs.
    pub outputs: Vec<TensorInfo>,
    /// `max_batch_size` from the configuration (0: the model does not batch).
    pub max_batch_size: u64,
}

impl ModelInfo {
    /// From a KServe v2 model-metadata object (`inputs`/`outputs` of `name`, `datatype`,
    /// `shape`) and, when known, the model's configuration (for `max_batch_size`; a
    /// `max_batch_size` key in the metadata object itself is read too).
    pub fn from_metadata(model: &str, meta: &Value, config: Option<&Value>) -> Result<Self> {
        let tensors = |key: &str| -> Result<Vec<TensorInfo>> {
            meta.get(key)
                .and_then(Value::as_array)
                .map(|list| {
                    list.iter()
                        .map(|t| {
                            Ok(TensorInfo {
                                name: t["name"].as_str().context("tensor without a name")?.to_string(),
                                datatype: t["datatype"]
                                    .as_str()
                                    .context("tensor without a datatype")?
                                    .to_string(),
                                shape: t["shape"]
                                    .as_array()
                                    .context("tensor without a shape")?
                                    .iter()
                                    .map(|d| d.as_i64().context("a dimension is not an integer"))
                                    .collect::<Result<_>>()?,
                            })
                        })
                        .collect()
                })
                .unwrap_or_else(|| Ok(Vec::new()))
        };
        let inputs = tensors("inputs")?;
        if inputs.is_empty() {
            bail!("model `{model}`: the metadata lists no inputs")
        }
        Ok(ModelInfo {
            name: model.to_string(),
            inputs,
            outputs: tensors("outputs")?,
            max_batch_size: config
                .and_then(|c| c.get("max_batch_size"))
                .or_else(|| meta.get("max_batch_size"))
                .and_then(Value::as_u64)
                .unwrap_or(0),
        })
    }
}

/// Cumulative server-side statistics of a model (all versions), from
/// `GET /v2/models/{model}/stats`: counts and nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct ServerStats {
    /// Successful requests.
    pub success_count: u64,
    /// Their total duration in the server, from arrival to response.
    pub success_ns: u64,
    /// Failed requests.
    pub fail_count: u64,
    /// Time waiting in queues.
    pub queue_ns: u64,
    /// Time preparing inputs.
    pub compute_input_ns: u64,
    /// Time in the model.
    pub compute_infer_ns: u64,
    /// Time extracting outputs.
    pub compute_output_ns: u64,
    /// Inferences (a batch of 8 in one request counts 8).
    pub inference_count: u64,
    /// Model executions (batches run).
    pub execution_count: u64,
}

impl ServerStats {
    /// `self - before`, counter by counter.
    pub fn since(&self, before: &ServerStats) -> ServerStats {
        ServerStats {
            success_count: self.success_count.saturating_sub(before.success_count),
            success_ns: self.success_ns.saturating_sub(before.success_ns),
            fail_count: self.fail_count.saturating_sub(before.fail_count),
            queue_ns: self.queue_ns.saturating_sub(before.queue_ns),
            compute_input_ns: self.compute_input_ns.saturating_sub(before.compute_input_ns),
            compute_infer_ns: self.compute_infer_ns.saturating_sub(before.compute_infer_ns),
            compute_output_ns: self.compute_output_ns.saturating_sub(before.compute_output_ns),
            inference_count: self.inference_count.saturating_sub(before.inference_count),
            execution_count: self.execution_count.saturating_sub(before.execution_count),
        }
    }
}

/// How long one inference took as the client saw it.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Building the request from the prepared body (the "client send" share).
    pub prepare: Duration,
    /// From handing the request to the connection until the response headers arrived.
    pub until_headers: Duration,
    /// Reading the response body after the headers.
    pub receive: Duration,
}

/// One prepared inference request body.
#[derive(Debug, Clone)]
pub struct Body {
    /// The bytes sent.
    pub bytes: Bytes,
    /// `Inference-Header-Content-Length` for the binary extension (JSON header length).
    pub header_length: Option<usize>,
    /// The same request as a gRPC message (raw input contents, slices of `bytes`), for
    /// `-i grpc`; `None` for JSON bodies.
    pub grpc: Option<pb::ModelInferRequest>,
}

/// A client for one server.
#[derive(Clone)]
pub struct Client {
    http: HttpClient<HttpConnector, Full<Bytes>>,
    /// With `-i grpc`: tonic's client over an HTTP/2 connection pool.
    grpc: Option<GrpcClient>,
    /// `http://host:port`, no trailing slash.
    pub base: String,
    timeout: Duration,
}

fn status_error(what: &str, e: tonic::Status) -> anyhow::Error {
    match e.code() {
        tonic::Code::Unavailable | tonic::Code::Unknown if e.message().contains("connect") => {
            anyhow!("cannot reach the server: {}", e.message())
        }
        code => anyhow!("{what}: {code:?}: {}", e.message()),
    }
}

impl Client {
    /// A client for `url` (`http://host:port` or `host:port`, as perf_analyzer's `-u`);
    /// each request fails after `timeout`.
    pub fn new(url: &str, timeout: Duration) -> Result<Self> {
        let url = url.trim_end_matches('/');
        let base = if url.contains("://") {
            url.to_string()
        } else {
            format!("http://{url}")
        };
        if !base.starts_with("http://") {
            bail!("--url {url}: only plain http:// is supported")
        }
        base.parse::<hyper::Uri>()
            .with_context(|| format!("--url {url} is not a URL"))?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let http = HttpClient::builder(TokioExecutor::new())
            .pool_max_idle_per_host(usize::MAX)
            .build(connector.clone());
        Ok(Client {
            http,
            grpc: None,
            base,
            timeout,
        })
    }

    /// The same, speaking Triton's gRPC to `url` (the gRPC port). One HTTP/2
    /// connection carries concurrent requests as streams, as tritonclient and
    /// perf_analyzer's gRPC clients do.
    pub fn grpc(url: &str, timeout: Duration) -> Result<Self> {
        let mut client = Client::new(url, timeout)?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let h2 = HttpClient::builder(TokioExecutor::new())
            .http2_only(true)
            .build(connector);
        let origin: hyper::Uri = client.base.parse()?;
        client.grpc = Some(
            GrpcClient::with_origin(h2, origin)
                .max_decoding_message_size(usize::MAX)
                .max_encoding_message_size(usize::MAX),
        );
        Ok(client)
    }

    /// The protocol this client speaks.
    pub fn protocol(&self) -> Protocol {
        match self.grpc {
            Some(_) => Protocol::Grpc,
            None => Protocol::Http,
        }
    }

    fn grpc_client(&self) -> Option<GrpcClient> {
        self.grpc.clone()
    }

    async fn get_json(&self, path: &str) -> Result<Value> {
        let uri: hyper::Uri = format!("{}{path}", self.base).parse()?;
        let req = hyper::Request::get(uri).body(Full::new(Bytes::new()))?;
        let resp = tokio::time::timeout(self.timeout, self.http.request(req))
            .await
            .map_err(|_| anyhow!("no answer from {} within {:?}", self.base, self.timeout))?
            .map_err(|e| anyhow!("cannot reach the server at {}: {}", self.base, connect_error(&e)))?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if !status.is_success() {
            let msg = value
                .get("error")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
            bail!("GET {path}: {status}: {msg}")
        }
        Ok(value)
    }

    /// A gRPC call within the request timeout (as every HTTP request is); errors name
    /// the RPC.
    async fn unary<T>(
        &self,
        rpc: &str,
        call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T> {
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| anyhow!("{rpc}: no answer from {} within {:?}", self.base, self.timeout))?
            .map(tonic::Response::into_inner)
            .map_err(|e| status_error(rpc, e))
    }

    /// Metadata and configuration of `model`; an error names an unknown or unready model.
    pub async fn model(&self, model: &str) -> Result<ModelInfo> {
        if let Some(mut g) = self.grpc_client() {
            let at = || format!("model `{model}` at {}", self.base);
            let meta = self
                .unary(
                    "ModelMetadata",
                    g.model_metadata(pb::ModelMetadataRequest {
                        name: model.to_string(),
                        version: String::new(),
                    }),
                )
                .await
                .with_context(at)?;
            let tensors = |t: &[pb::model_metadata_response::TensorMetadata]| -> Vec<Value> {
                t.iter()
                    .map(|t| json!({"name": t.name, "datatype": t.datatype, "shape": t.shape}))
                    .collect()
            };
            let meta = json!({"name": meta.name, "inputs": tensors(&meta.inputs), "outputs": tensors(&meta.outputs)});
            let config = self
                .unary(
                    "ModelConfig",
                    g.model_config(pb::ModelConfigRequest {
                        name: model.to_string(),
                        version: String::new(),
                    }),
                )
                .await
                .ok()
                .and_then(|r| r.config)
                .map(|c| json!({"max_batch_size": c.max_batch_size}));
            return ModelInfo::from_metadata(model, &meta, config.as_ref()).context("model metadata");
        }
        let meta = self
            .get_json(&format!("/v2/models/{model}"))
            .await
            .with_context(|| format!("model `{model}` at {}", self.base))?;
        let config = self.get_json(&format!("/v2/models/{model}/config")).await.ok();
        ModelInfo::from_metadata(model, &meta, config.as_ref()).context("model metadata")
    }

    /// The server's cumulative statistics of `model`, summed over its versions.
    pub async fn stats(&self, model: &str) -> Result<ServerStats> {
        let v = match self.grpc_client() {
            Some(mut g) => {
                let stats = self
                    .unary(
                        "ModelStatistics",
                        g.model_statistics(pb::ModelStatisticsRequest {
                            name: model.to_string(),
                            version: String::new(),
                        }),
                    )
                    .await?;
                let d = |d: Option<pb::StatisticDuration>| {
                    let d = d.unwrap_or_default();
                    json!({"count": d.count, "ns": d.ns})
                };
                let rows: Vec<Value> = stats
                    .model_stats
                    .iter()
                    .map(|m| {
                        let i = m.inference_stats.unwrap_or_default();
                        json!({
                            "inference_count": m.inference_count,
                            "execution_count": m.execution_count,
                            "inference_stats": {
                                "success": d(i.success), "fail": d(i.fail), "queue": d(i.queue),
                                "compute_input": d(i.compute_input), "compute_infer": d(i.compute_infer),
                                "compute_output": d(i.compute_output),
                            }
                        })
                    })
                    .collect();
                json!({ "model_stats": rows })
            }
            None => self.get_json(&format!("/v2/models/{model}/stats")).await?,
        };
        let mut s = ServerStats::default();
        for m in v["model_stats"].as_array().into_iter().flatten() {
            let stat = |k: &str, f: &str| m["inference_stats"][k][f].as_u64().unwrap_or(0);
            s.success_count += stat("success", "count");
            s.success_ns += stat("success", "ns");
            s.fail_count += stat("fail", "count");
            s.queue_ns += stat("queue", "ns");
            s.compute_input_ns += stat("compute_input", "ns");
            s.compute_infer_ns += stat("compute_infer", "ns");
            s.compute_output_ns += stat("compute_output", "ns");
            s.inference_count += m["inference_count"].as_u64().unwrap_or(0);
            s.execution_count += m["execution_count"].as_u64().unwrap_or(0);
        }
        Ok(s)
    }

    /// Sends one inference request; an error for anything but 200 (with the server's
    /// message), a refused connection or the timeout.
    pub async fn infer(&self, model: &str, body: &Body) -> Result<Timing> {
        if let Some(mut g) = self.grpc_client() {
            let begin = Instant::now();
            let request = body
                .grpc
                .clone()
                .context("-i grpc sends raw tensors: use --encoding binary (JSON bodies are HTTP only)")?;
            let start = Instant::now();
            let response = tokio::time::timeout(self.timeout, g.model_infer(request))
                .await
                .map_err(|_| anyhow!("timed out after {:?}", self.timeout))?
                .map_err(|e| status_error("ModelInfer", e))?;
            drop(response);
            // A unary call returns the whole message at once: all of it is "until
            // headers", nothing is read after.
            return Ok(Timing {
                prepare: start - begin,
                until_headers: start.elapsed(),
                receive: Duration::ZERO,
            });
        }
        let begin = Instant::now();
        let uri: hyper::Uri = format!("{}/v2/models/{model}/infer", self.base).parse()?;
        let mut req = hyper::Request::post(uri);
        req = match body.header_length {
            Some(n) => req
                .header("content-type", "application/octet-stream")
                .header("inference-header-content-length", n),
            None => req.header("content-type", "application/json"),
        };
        let req = req.body(Full::new(body.bytes.clone()))?;
        let start = Instant::now();
        let prepare = start - begin;
        let exchange = async {
            let resp =
                self.http.request(req).await.map_err(|e| {
                    anyhow!("cannot reach the server at {}: {}", self.base, connect_error(&e))
                })?;
            let until_headers = start.elapsed();
            let status = resp.status();
            let bytes = resp.into_body().collect().await?.to_bytes();
            if !status.is_success() {
                let msg = serde_json::from_slice::<Value>(&bytes)
                    .ok()
                    .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_string))
                    .unwrap_or_else(|| String::from_utf8_lossy(&bytes).chars().take(200).collect());
                bail!("{status}: {msg}")
            }
            Ok(Timing {
                prepare,
                until_headers,
                receive: start.elapsed() - until_headers,
            })
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| anyhow!("timed out after {:?}", self.timeout))?
    }
}

/// The innermost cause of a client error (hyper's outer message is only "client error").
fn connect_error(e: &hyper_util::client::legacy::Error) -> String {
    let mut source: &dyn std::error::Error = e;
    while let Some(s) = source.source() {
        source = s;
    }
    source.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn metadata_is_read_from_a_kserve_object() {
        let meta = json!({
            "name": "m",
            "inputs": [{"name": "ids", "datatype": "INT64", "shape": [-1, 64]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 384]}],
            "max_batch_size": 16
        });
        let info = ModelInfo::from_metadata("m", &meta, None).unwrap();
        assert_eq!(info.inputs[0].shape, vec![-1, 64]);
        assert_eq!(
            (info.inputs[0].datatype.as_str(), info.outputs[0].name.as_str()),
            ("INT64", "y")
        );
        assert_eq!(info.max_batch_size, 16);
        // The server's configuration wins over a max_batch_size in the metadata.
        let config = json!({"max_batch_size": 4});
        assert_eq!(
            ModelInfo::from_metadata("m", &meta, Some(&config))
                .unwrap()
                .max_batch_size,
            4
        );

        let no_inputs = ModelInfo::from_metadata("m", &json!({"outputs": []}), None).unwrap_err();
        assert!(
            format!("{no_inputs:#}").contains("lists no inputs"),
            "{no_inputs:#}"
        );
        let bad = json!({"inputs": [{"name": "x", "shape": [1]}]});
        let err = ModelInfo::from_metadata("m", &bad, None).unwrap_err();
        assert!(format!("{err:#}").contains("without a datatype"), "{err:#}");
    }
}
