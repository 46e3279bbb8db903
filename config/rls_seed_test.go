package config

// The fuzzer (FuzzParseConfig) and TestValidConfigSeeds also start from a
// config with an rls section.
func init() {
	validConfigs = append(validConfigs, []byte(`admin_token: t
tenants:
  - name: acme
    plan: free
    keys: [{key: k1}]
rls_listen: 127.0.0.1:8081
rls:
  reflection: true
  domains:
    - domain: costgate
      descriptors:
        - key: tenant
          as: tenant
          plan: free
          descriptors:
            - key: model
              as: model
              hits: output_tokens
              rate_limit: {unit: minute, requests_per_unit: 100000, algorithm: token_bucket}
            - key: generic_key
              value: search
              price_per_hit: "0.005"
        - key: remote_address
          value: "10.*"
          shadow_mode: true
          on_store_failure: fail_closed
          rate_limit: {unit: second, unit_multiplier: 2, requests_per_unit: 10}
        - key: remote_address
          value: 50.0.0.5
          rate_limit: {unit: second, requests_per_unit: 0}
        - key: internal
          rate_limit: {unlimited: true}
`))
}
