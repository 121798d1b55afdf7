// Package stack starts the infrastructure the tests, the demo driver and the
// chaos harness run against: a Kafka-protocol broker here, a Postgres server
// from the library's pkg/pgtest.
//
// The broker comes in three flavours:
//
//   - external, when KAFKA_BROKERS is set: the package only hands out the
//     addresses (and creates topics there);
//   - Apache Kafka from its jars, as JVM processes (STACK_KAFKA=apache);
//   - by default, an in-process kfake cluster (pkg/kafkatest).
//
// Typical use from TestMain:
//
//	func TestMain(m *testing.M) {
//		ctx := context.Background()
//		pg, err := pgtest.Start(ctx)
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
