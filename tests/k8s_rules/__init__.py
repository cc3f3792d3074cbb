"""What a real Kubernetes API server and the operators' admission webhooks check, brought to the tests.

- cel.py: the CRDs' own rules (x-kubernetes-validations, CEL), with the API server's structural defaulting
  and its transition-rule semantics (oldSelf on update, optionalOldSelf, messageExpression).
- trainer.py, jobset.py, training_operator.py, aistore.py: each operator's admission webhook, ported from its
  source at the vendored version (tests/crds/README.md), every rule with a link to the function it comes from.
- admission.py: the API server's order for one create or update: defaults, mutating webhook, schema, CEL,
  validating webhook; `admit` returns the stored object or the refusals in the operator's words.
"""
