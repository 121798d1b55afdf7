// Package stack starts the infrastructure the tests, the demo driver and the
// chaos harness run against: a Postgres server and a Kafka-protocol broker.
//
// Both come in two flavours:
//
//   - external, when DATABASE_URL / KAFKA_BROKERS are set: the package only
//     hands out connection strings (and creates databases / topics on them);
//   - throwaway, otherwise: a private Postgres cluster (initdb + pg_ctl in a
//     temp dir) and an in-process kfake Kafka cluster.
//
// Typical use from TestMain:
//
//	func TestMain(m *testing.M) {
//		ctx := context.Background()
//		pg, err := stack.StartPostgres(ctx)
//		if err != nil { log.Fatal(err) }
//		kafka, err := stack.StartKafka(ctx, stack.KafkaOptions{})
//		if err != nil { pg.Stop(); log.Fatal(err) }
//		code := m.Run()
//		kafka.Close()
//		pg.Stop()
//		os.Exit(code)
//	}
//
// Services and tests must build their Sarama clients from SaramaConfig so that
// the same protocol version is used against kfake and against real Kafka.
package stack
