"""Alerting on job impact: the policy, alert lifecycle and incidents, notifiers, Prometheus."""
