module github.com/quota-coordinator/quota-coordinator/clients/go

go 1.19

require (
	github.com/nats-io/nats.go v1.22.1
	github.com/nats-io/nkeys v0.3.0
)

require (
	github.com/nats-io/nuid v1.0.1 // indirect
	golang.org/x/crypto v0.0.0-20210314154223-e6e6c4f2bb5b // indirect
)
