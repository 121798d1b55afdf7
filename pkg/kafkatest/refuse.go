package kafkatest

import "github.com/twmb/franz-go/pkg/kmsg"

// RefuseProduce answers a produce request with code (a kerr code, such as
// kerr.NotLeaderForPartition.Code) for every partition it names: what a
// kfake control function returns to make the broker refuse a write.
//
//	cluster.ControlKey(kmsg.Produce.Int16(), func(r kmsg.Request) (kmsg.Response, error, bool) {
//		return kafkatest.RefuseProduce(r.(*kmsg.ProduceRequest), kerr.NotLeaderForPartition.Code), nil, true
//	})
func RefuseProduce(req *kmsg.ProduceRequest, code int16) *kmsg.ProduceResponse {
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	for _, t := range req.Topics {
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic = t.Topic
		for _, p := range t.Partitions {
			rp := kmsg.NewProduceResponseTopicPartition()
			rp.Partition = p.Partition
			rp.ErrorCode = code
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}
