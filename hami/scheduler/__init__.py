"""The scheduler extender service that kube-scheduler calls for filter, prioritize and bind."""
