//! The integration tests, one binary: each module is the tests of one subject, against the
//! real services (see `docs/testing.md`); `common` holds what they start and read.

mod common;

mod admin;
mod amqp;
mod architecture;
mod cluster;
mod config;
mod config_load;
mod console;
mod control;
mod crash;
mod dead_letters;
mod docs;
mod envelope;
mod faults;
mod faults_amqp;
mod faults_redis;
mod hash_payload;
mod health;
mod hostile;
mod http_sink;
mod ingress;
mod ingress_config;
mod ingress_faults;
mod ingress_kafka;
mod ingress_kafka_topic;
mod ingress_producers;
mod kafka;
mod kafka_mock;
mod log_volume;
mod loss;
mod model;
mod observability;
mod operate;
mod packaging;
mod producers;
mod rabbit_cluster;
mod refusals;
mod reload;
mod schedules;
mod security;
mod tls;
mod wakeup;
