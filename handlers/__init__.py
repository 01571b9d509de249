"""AWS Lambda entry points over the plane core (thin adapters; one module knows the
API Gateway event shape)."""
