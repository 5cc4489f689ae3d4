"""The custom-resource validator: real operator schemas, strict about fields nobody declared."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.deploy.crd_schemas import known_kinds, to_json_schema, validate_custom_resource

KAFKA: dict[str, Any] = {
    "apiVersion": "kafka.strimzi.io/v1beta2",
    "kind": "Kafka",
    "metadata": {
        "name": "scheduler",
        "annotations": {"strimzi.io/node-pools": "enabled", "strimzi.io/kraft": "enabled"},
    },
    "spec": {
        "kafka": {
            "version": "3.9.0",
            "metadataVersion": "3.9-IV0",
            "listeners": [{"name": "plain", "port": 9092, "type": "internal", "tls": False}],
            # config is x-kubernetes-preserve-unknown-fields: any broker setting goes.
            "config": {"offsets.topic.replication.factor": 3, "min.insync.replicas": 2},
        },
        "entityOperator": {"topicOperator": {}},
    },
}
KAFKA_NODE_POOL: dict[str, Any] = {
    "apiVersion": "kafka.strimzi.io/v1beta2",
    "kind": "KafkaNodePool",
    "metadata": {"name": "dual-role", "labels": {"strimzi.io/cluster": "scheduler"}},
    "spec": {
        "replicas": 3,
        "roles": ["controller", "broker"],
        "storage": {
            "type": "jbod",
            "volumes": [{"id": 0, "type": "persistent-claim", "size": "10Gi", "kraftMetadata": "shared"}],
        },
        # Quantities are int-or-string.
        "resources": {"requests": {"cpu": 1, "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}},
    },
}
KAFKA_TOPIC: dict[str, Any] = {
    "apiVersion": "kafka.strimzi.io/v1beta2",
    "kind": "KafkaTopic",
    "metadata": {"name": "scheduler.jobs", "labels": {"strimzi.io/cluster": "scheduler"}},
    "spec": {"partitions": 12, "replicas": 3, "config": {"retention.ms": 604800000}},
}
PG_CLUSTER: dict[str, Any] = {
    "apiVersion": "postgresql.cnpg.io/v1",
    "kind": "Cluster",
    "metadata": {"name": "scheduler-db", "namespace": "scheduler"},
    "spec": {
        "instances": 3,
        "imageName": "ghcr.io/cloudnative-pg/postgresql:17.2",
        "storage": {"size": "10Gi"},
        "bootstrap": {"initdb": {"database": "scheduler", "owner": "scheduler"}},
        "postgresql": {"parameters": {"max_connections": "200"}},
        "monitoring": {"enablePodMonitor": True},
    },
}
SCALED_OBJECT: dict[str, Any] = {
    "apiVersion": "keda.sh/v1alpha1",
    "kind": "ScaledObject",
    "metadata": {"name": "scheduler-worker"},
    "spec": {
        "scaleTargetRef": {"name": "scheduler-worker"},
        "minReplicaCount": 1,
        "maxReplicaCount": 10,
        "triggers": [
            {
                "type": "kafka",
                "metadata": {
                    "bootstrapServers": "scheduler-kafka-bootstrap:9092",
                    "consumerGroup": "scheduler-workers",
                    "topic": "scheduler.jobs",
                    "lagThreshold": "50",
                },
                "authenticationRef": {"name": "kafka-auth"},
            }
        ],
    },
}
TRIGGER_AUTHENTICATION: dict[str, Any] = {
    "apiVersion": "keda.sh/v1alpha1",
    "kind": "TriggerAuthentication",
    "metadata": {"name": "kafka-auth"},
    "spec": {"secretTargetRef": [{"parameter": "sasl", "name": "kafka-credentials", "key": "sasl"}]},
}
POD_MONITOR: dict[str, Any] = {
    "apiVersion": "monitoring.coreos.com/v1",
    "kind": "PodMonitor",
    "metadata": {"name": "scheduler"},
    "spec": {
        "selector": {"matchLabels": {"app.kubernetes.io/name": "scheduler"}},
        "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "30s"}],
    },
}
PROMETHEUS_RULE: dict[str, Any] = {
    "apiVersion": "monitoring.coreos.com/v1",
    "kind": "PrometheusRule",
    "metadata": {"name": "scheduler"},
    "spec": {
        "groups": [
            {
                "name": "scheduler",
                "rules": [
                    {
                        "alert": "SchedulerWorkersDown",
                        "expr": 'sum(up{job="scheduler-worker"}) == 0',
                        "for": "5m",
                        "labels": {"severity": "critical"},
                        "annotations": {"summary": "No scheduler worker is up"},
                    }
                ],
            }
        ]
    },
}
EXAMPLES = [
    KAFKA,
    KAFKA_NODE_POOL,
    KAFKA_TOPIC,
    PG_CLUSTER,
    SCALED_OBJECT,
    TRIGGER_AUTHENTICATION,
    POD_MONITOR,
    PROMETHEUS_RULE,
]


def changed(example: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    obj = copy.deepcopy(example)
    *parents, last = path.split(".")
    node = obj
    for key in parents:
        node = node[key]
    node[last] = value
    return obj


def renamed(example: dict[str, Any], path: str, new_name: str) -> dict[str, Any]:
    obj = copy.deepcopy(example)
    *parents, last = path.split(".")
    node = obj
    for key in parents:
        node = node[key]
    node[new_name] = node.pop(last)
    return obj


def test_every_kind_the_manifests_use_has_a_schema() -> None:
    assert {(e["apiVersion"], e["kind"]) for e in EXAMPLES} == known_kinds()


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: str(e["kind"]))
def test_minimal_resource_is_valid(example: dict[str, Any]) -> None:
    assert validate_custom_resource(example) == []


def test_misspelled_node_pool_field_is_named() -> None:
    errors = validate_custom_resource(renamed(KAFKA_NODE_POOL, "spec.replicas", "replcas"))
    assert "spec.replcas: unknown field (did you mean 'replicas'?)" in errors
    assert "spec: 'replicas' is a required property" in errors


def test_misspelled_scaled_object_field_is_named() -> None:
    errors = validate_custom_resource(renamed(SCALED_OBJECT, "spec.maxReplicaCount", "maxReplicaCounts"))
    assert errors == ["spec.maxReplicaCounts: unknown field (did you mean 'maxReplicaCount'?)"]


def test_unknown_field_deep_in_a_list_is_named() -> None:
    pool = copy.deepcopy(KAFKA_NODE_POOL)
    pool["spec"]["storage"]["volumes"][0]["deleteClaims"] = True
    assert validate_custom_resource(pool) == [
        "spec.storage.volumes[0].deleteClaims: unknown field (did you mean 'deleteClaim'?)"
    ]


def test_wrong_type_fails() -> None:
    errors = validate_custom_resource(changed(KAFKA_TOPIC, "spec.partitions", "twelve"))
    assert errors == ["spec.partitions: expected integer, got 'twelve'"]


def test_int_or_string_takes_either_but_nothing_else() -> None:
    pool = copy.deepcopy(KAFKA_NODE_POOL)
    pool["spec"]["resources"]["requests"]["cpu"] = "500m"
    assert validate_custom_resource(pool) == []
    pool["spec"]["resources"]["requests"]["cpu"] = True
    assert validate_custom_resource(pool) == [
        "spec.resources.requests.cpu: expected integer or string, got True"
    ]


def test_enum_is_enforced() -> None:
    errors = validate_custom_resource(changed(KAFKA_NODE_POOL, "spec.roles", ["broker", "zookeeper"]))
    assert errors == ["spec.roles[1]: 'zookeeper' is not one of ['controller', 'broker']"]


def test_metadata_is_object_meta() -> None:
    assert validate_custom_resource(changed(PG_CLUSTER, "metadata.label", {"app": "db"})) == [
        "metadata.label: unknown field (did you mean 'labels'?)"
    ]
    assert validate_custom_resource(changed(PG_CLUSTER, "metadata.labels", {"replicas": 3})) == [
        "metadata.labels.replicas: expected string, got 3"
    ]


def test_object_that_declares_no_fields_takes_none() -> None:
    # CNPG declares this PVC template's metadata as a bare object: the API server prunes anything in it.
    cluster = copy.deepcopy(PG_CLUSTER)
    cluster["spec"]["ephemeralVolumeSource"] = {
        "volumeClaimTemplate": {
            "metadata": {"labels": {"app": "db"}},
            "spec": {"accessModes": ["ReadWriteOnce"]},
        }
    }
    assert validate_custom_resource(cluster) == [
        "spec.ephemeralVolumeSource.volumeClaimTemplate.metadata.labels: unknown field"
    ]


def test_unknown_kind_fails_once() -> None:
    errors = validate_custom_resource({"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledJob", "metadata": {}})
    assert errors == ["(root): no CRD schema is vendored for apiVersion 'keda.sh/v1alpha1' kind 'ScaledJob'"]


def test_extensions_the_vendored_crds_do_not_use() -> None:
    # No vendored CRD has nullable or an embedded resource; their translation is still pinned here.
    schema = to_json_schema(
        {
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "properties": {
                        "size": {"type": "string", "nullable": True, "enum": ["small", "large"]},
                        "template": {
                            "type": "object",
                            "x-kubernetes-embedded-resource": True,
                            "properties": {
                                "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                            },
                        },
                    },
                }
            },
        }
    )
    spec = schema["properties"]["spec"]
    assert spec["additionalProperties"] is False
    assert spec["properties"]["size"] == {"type": ["string", "null"], "enum": ["small", "large", None]}
    template = spec["properties"]["template"]
    assert {"apiVersion", "kind", "metadata", "spec"} <= set(template["properties"])
    assert template["additionalProperties"] is False
    assert "additionalProperties" not in template["properties"]["spec"]
