"""deploy/k8s/model provisions the volume the GPU overlay serves from: its claim is the one the
overlay's pods mount, readable from many nodes, and its download Job fills the folder the
overlay's PDSERVE_MODEL names, the only place a hub download happens."""

from __future__ import annotations

from deploy_paths import DOCKER, K8S
from k8s_render import pod_templates, render
from test_deploy_tp_sizing import config_map

MANY_READERS = {"ReadOnlyMany", "ReadWriteMany"}


def overlay_claims(rendered) -> set[str]:
    return {v["persistentVolumeClaim"]["claimName"] for _, spec in pod_templates(rendered["gpu"])
            for v in spec.get("volumes", []) if "persistentVolumeClaim" in v}


def test_the_claim_it_makes_is_the_one_the_gpu_overlay_mounts():
    (claim,) = [m for m in render(K8S / "model") if m["kind"] == "PersistentVolumeClaim"]
    assert set(claim["spec"]["accessModes"]) & MANY_READERS


def test_the_overlay_mounts_only_the_provisioned_claim(rendered):
    provisioned = {m["metadata"]["name"] for m in render(K8S / "model") if m["kind"] == "PersistentVolumeClaim"}
    assert overlay_claims(rendered) == provisioned


def test_the_download_job_fills_the_overlay_s_model_folder(rendered):
    model = config_map(rendered["gpu"])["PDSERVE_MODEL"]
    ((job, spec),) = list(pod_templates(render(K8S / "model")))
    (container,) = spec["containers"]
    assert f"--local-dir={model}" in container["args"]
    mount = next(m for m in container["volumeMounts"] if model.startswith(m["mountPath"] + "/"))
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["persistentVolumeClaim"]["claimName"] in overlay_claims(rendered), job["metadata"]["name"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_serving_pods_run_offline_and_only_the_job_goes_online(rendered):
    assert "HF_HUB_OFFLINE=1" in (DOCKER / "Dockerfile").read_text()
    assert "HF_HUB_OFFLINE" not in config_map(rendered["gpu"])
    for _, spec in pod_templates(rendered["gpu"]):
        for container in spec["containers"]:
            assert all(e["name"] != "HF_HUB_OFFLINE" for e in container.get("env", [])), container["name"]
    ((_, spec),) = list(pod_templates(render(K8S / "model")))
    assert {"name": "HF_HUB_OFFLINE", "value": "0"} in spec["containers"][0]["env"]
