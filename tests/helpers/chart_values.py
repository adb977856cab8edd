"""Values files the chart tests render: the defaults and the other shapes a deployment takes
(GPU and CPU workers of a tenant, an external or Sentinel Redis, models from volumes or
by name, scale to zero, no autoscaling)."""

from __future__ import annotations

from typing import Any

SCENARIOS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "gpu-and-cpu-of-a-tenant": {
        "workerDefaults": {"env": {"KVRELAY_NAMESPACE": "team-a"}},
        "workers": {
            "smollm2": {"env": {"KVRELAY_MAX_NUM_SEQS": "32"}},
            "smollm2-cpu": {"enabled": True},
        },
        "gateway": {
            "env": {"KVRELAY_NAMESPACE": "team-a"},
            "apiKeys": {"keys": {"sk-alice": "alice", "sk-bob": "bob"}},
            "adminKey": {"existingSecret": "gateway-admin"},
        },
    },
    "external-redis": {
        "redis": {
            "internal": {"enabled": False},
            "external": {"address": "redis.data.svc:6379", "database": 2},
            "auth": {"url": "redis://:pw@redis.data.svc:6379/2", "password": "pw"},
        },
    },
    "sentinel-redis": {
        "redis": {
            "internal": {"enabled": False},
            "external": {"address": "sentinel-0.data:26379,sentinel-1.data:26379",
                         "sentinelMaster": "kvrelay", "tls": True},
            "auth": {"existingSecret": "redis-credentials", "usernameKey": "username",
                     "sentinelPasswordKey": "sentinel-password"},
        },
    },
    "external-redis-without-password": {
        "redis": {
            "internal": {"enabled": False},
            "external": {"address": "redis.data.svc:6379"},
            "auth": {"url": "redis://redis.data.svc:6379/0", "passwordKey": ""},
        },
    },
    "models-from-volumes-scaled-to-zero": {
        "workerDefaults": {"autoscaling": {"minReplicas": 0, "maxReplicas": 8}},
        "workers": {
            "smollm2": {"modelCache": {"persistentVolumeClaim": "kvrelay-models"}},
            "llama": {
                "huggingFace": {"repo": "acme/llama-1b", "revision": "main",
                                "persistentVolumeClaim": "hf-cache",
                                "tokenSecret": {"name": "hf-token"}},
            },
            "qwen": {
                "model": "/models/qwen2-0.5b.gguf", "servedModelName": "qwen2-0.5b",
                "modelVolume": {"persistentVolumeClaim": {"claimName": "models",
                                                          "readOnly": True}},
            },
        },
    },
    "fixed-replicas": {
        "redis": {"internal": {"persistence": {"enabled": False}}},
        "workerDefaults": {"autoscaling": {"enabled": False}, "replicas": 3,
                           "podDisruptionBudget": {"enabled": False}},
        "gateway": {"enabled": False},
    },
}
