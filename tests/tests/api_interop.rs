//! What gRPC tooling finds on the api socket besides gpuprof.v1: the standard health service
//! and server reflection, v1 and v1alpha (what grpcurl, grpcui and Postman use to list and
//! call the API without the .proto files).

use anyhow::Result;
use gpuprof_testkit::TestDaemon;
use prost::Message;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
use tonic_reflection::pb::{v1, v1alpha};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

/// One reflection request on a v1 stream, its answer.
async fn ask_v1(
    c: &mut v1::server_reflection_client::ServerReflectionClient<tonic::transport::Channel>,
    req: v1::server_reflection_request::MessageRequest,
) -> Result<v1::server_reflection_response::MessageResponse> {
    let req = v1::ServerReflectionRequest { host: String::new(), message_request: Some(req) };
    let mut answers = c.server_reflection_info(tokio_stream::iter([req])).await?.into_inner();
    let answer = answers.message().await?.ok_or_else(|| anyhow::anyhow!("no reflection answer"))?;
    answer.message_response.ok_or_else(|| anyhow::anyhow!("an empty reflection answer"))
}

#[test]
fn health_and_reflection_v1_and_v1alpha_are_served_on_the_socket() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = TestDaemon::start(&dir.path().join("state"))?;
    rt().block_on(async {
        let channel = gpuprofctl::unix_channel(&d.api_socket).await?;

        let mut health = HealthClient::new(channel.clone());
        for service in ["", "gpuprof.v1.Gpuprof"] {
            let r = health.check(HealthCheckRequest { service: service.into() }).await?.into_inner();
            assert_eq!(r.status(), ServingStatus::Serving, "health of {service:?}");
        }
        let e = health.check(HealthCheckRequest { service: "no.such.Service".into() }).await.expect_err("unknown");
        assert_eq!(e.code(), tonic::Code::NotFound, "{e}");

        use v1::server_reflection_request::MessageRequest as Req;
        use v1::server_reflection_response::MessageResponse as Resp;
        let mut reflection = v1::server_reflection_client::ServerReflectionClient::new(channel.clone());
        let Resp::ListServicesResponse(list) = ask_v1(&mut reflection, Req::ListServices(String::new())).await? else {
            anyhow::bail!("list_services answered with something else");
        };
        let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
        names.sort();
        assert_eq!(names, ["gpuprof.v1.Gpuprof", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"]);

        // The descriptors are complete enough to call the API from them.
        let Resp::FileDescriptorResponse(files) =
            ask_v1(&mut reflection, Req::FileContainingSymbol("gpuprof.v1.Gpuprof".into())).await?
        else {
            anyhow::bail!("file_containing_symbol answered with something else");
        };
        let file = prost_types::FileDescriptorProto::decode(files.file_descriptor_proto[0].as_slice())?;
        assert_eq!(file.package(), "gpuprof.v1");
        let service = file.service.iter().find(|s| s.name() == "Gpuprof").expect("the Gpuprof service");
        let methods: Vec<&str> = service.method.iter().map(|m| m.name()).collect();
        for m in ["GetStatus", "StartSession", "QueryRecords", "ExportTrace"] {
            assert!(methods.contains(&m), "{m} missing from {methods:?}");
        }
        let e = ask_v1(&mut reflection, Req::FileContainingSymbol("no.such.Thing".into()))
            .await
            .expect_err("an unknown symbol is an error");
        let status = e.downcast_ref::<tonic::Status>().expect("a gRPC status");
        assert_eq!(status.code(), tonic::Code::NotFound, "{status}");

        // v1alpha, which older tools still ask for.
        let mut alpha = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
        let req = v1alpha::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(v1alpha::server_reflection_request::MessageRequest::ListServices(String::new())),
        };
        let answer = alpha.server_reflection_info(tokio_stream::iter([req])).await?.into_inner().message().await?;
        let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
            answer.and_then(|a| a.message_response)
        else {
            anyhow::bail!("v1alpha list_services answered with something else");
        };
        let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
        assert!(names.contains(&"gpuprof.v1.Gpuprof".to_string()), "{names:?}");
        anyhow::Ok(())
    })?;
    assert_eq!(d.terminate()?, 0);
    Ok(())
}
